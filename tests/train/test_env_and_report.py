from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from shoal.train.env import TrainEnv, TrainEnvError
from shoal.train.report import Reporter


class Scheduler:
    """A stand-in for the scheduler's report endpoint."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.received: list[tuple[str, dict[str, Any]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.received.append((self.path, json.loads(body)))
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scheduler() -> Iterator[Scheduler]:
    server = Scheduler({"batch_size": 48})
    yield server
    server.close()


def test_env_contract_is_read() -> None:
    env = TrainEnv.from_environ(
        {
            "RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234", "SHOAL_JOB": "mlp",
            "SHOAL_CHECKPOINT_DIR": "/tmp/ck", "SHOAL_SCHEDULER_URL": "http://h:1/",
            "SHOAL_BATCH_SIZE": "256", "SHOAL_MAX_LOCAL_BSZ": "32", "SHOAL_DEVICE_TYPE": "a100",
        }
    )
    assert (env.rank, env.world_size, env.local_rank, env.num_nodes) == (1, 4, 1, 2)
    assert env.master_addr == "10.0.0.1" and env.master_port == 1234 and env.job == "mlp"
    assert env.checkpoint_dir == Path("/tmp/ck") and env.scheduler_url == "http://h:1"
    assert env.batch_size == 256 and env.max_local_bsz == 32 and env.distributed
    assert env.device_type == "a100"
    plain = TrainEnv.from_environ({})
    assert (plain.rank, plain.world_size, plain.checkpoint_dir, plain.scheduler_url,
            plain.device_type) == (0, 1, None, None, None)


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK"),
        ({"SHOAL_BATCH_SIZE": "0"}, "SHOAL_BATCH_SIZE"),
        ({"SHOAL_CHECKPOINT_INTERVAL": "soon"}, "SHOAL_CHECKPOINT_INTERVAL"),
    ],
)
def test_bad_env_names_the_variable(env: dict[str, str], name: str) -> None:
    with pytest.raises(TrainEnvError, match=name):
        TrainEnv.from_environ(env)


def test_reporter_posts_json_and_reads_batch_size_answer(scheduler: Scheduler) -> None:
    reporter = Reporter(scheduler.url, "my job")
    reporter.submit({"epoch": 1, "steps": 5})
    reporter.close()
    assert scheduler.received == [("/api/jobs/my%20job/report", {"epoch": 1, "steps": 5})]
    assert reporter.sent == 1 and reporter.requested_batch_size == 48


def test_reporter_never_blocks_or_raises_without_a_scheduler(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from tests.train.procs import free_port

    reporter = Reporter(f"http://127.0.0.1:{free_port()}", "job", timeout_s=0.5)
    start = time.monotonic()
    for step in range(100):
        reporter.submit({"steps": step})
    assert time.monotonic() - start < 0.1  # submit only queues
    reporter.close()
    assert reporter.failed >= 1 and reporter.sent == 0
    assert "training continues" in caplog.text
    assert not Reporter(None, "job").enabled


def test_a_probe_trains_its_steps_reports_them_as_a_probe_and_exits(
        scheduler: Scheduler, tmp_path: Path) -> None:
    from tests.train.procs import launch, logs, wait_all

    # 97 samples in batches of 12: 9 steps an epoch, 3 epochs; the probe stops after 6.
    procs = launch(1, tmp_path, SHOAL_PROBE_STEPS="6", SHOAL_CHECKPOINT_DIR="",
                   SHOAL_SCHEDULER_URL=scheduler.url, SHOAL_DEVICE_TYPE="fast")
    assert wait_all(procs) == [0], logs(tmp_path)
    assert "probe of 6 steps done" in logs(tmp_path)
    assert not (tmp_path / "final.pt").exists()  # ended mid-training
    assert (tmp_path / "progress").read_text() == "5"  # it ends inside the 6th step()
    assert not (tmp_path / "checkpoint").exists()
    reports = [payload for _, payload in scheduler.received]
    assert reports and all(r["probe"] for r in reports)
    rows = reports[-1]["profile"]
    # The first two steps are warm-up; the other four are the probe's measurement.
    assert [(r["device_type"], r["num_replicas"], r["count"]) for r in rows] == [("fast", 1, 4)]


def test_a_probe_runs_one_process() -> None:
    with pytest.raises(TrainEnvError, match="SHOAL_PROBE_STEPS"):
        TrainEnv.from_environ({"SHOAL_PROBE_STEPS": "10", "WORLD_SIZE": "2"})
