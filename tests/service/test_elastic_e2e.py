"""Real processes through the API: resizes while training, crash recovery, bounded retries."""

from __future__ import annotations

import itertools
import json
import os
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner

from shoal.backends.local.job import restart_losses
from shoal.cli.main import cli
from tests.service.helpers import Service, all_done, job_yaml, running_service, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory):
    with running_service(tmp_path_factory.mktemp("e2e") / "home") as svc:
        yield svc


def _went_up_then_down(counts: list[int]) -> bool:
    peak = 0
    for previous, current in itertools.pairwise(counts):
        if current > previous:
            peak = current
        elif peak and current < peak:
            return True
    return False


def test_three_jobs_resize_while_training_and_finish(service: Service) -> None:
    # Long enough (sleep-dominated steps) that it is still training after it grows and after
    # the pre-warmed shrink that the other two jobs cause completes (at 10 epochs it could
    # finish on two replicas while its one-replica standby was still starting).
    assert service.submit(job_yaml("first", epochs=30, sleep=0.2)).status_code == 201
    # Alone on two slots, the adaptive policy grows the first job once it has profiled itself.
    def trained_on_two() -> bool:
        return any(row["num_replicas"] == 2 for row in service.job("first")["profile"])

    wait_until(trained_on_two, 90, "first job to grow and train on 2 replicas",
               service.diagnostics)
    for name in ("second", "third"):
        assert service.submit(job_yaml(name, epochs=1, sleep=0.05)).status_code == 201
    names = ["first", "second", "third"]
    wait_until(lambda: all_done(service, names), 300, "all jobs to finish", service.diagnostics)

    jobs = {j["name"]: j for j in service.jobs()}
    for name in names:
        job = jobs[name]
        assert job["state"] == "finished", (name, job.get("failure"), service.log_text(name))
        done = json.loads((service.home / "checkpoints" / name / "done.json").read_text())
        assert done["steps"] > 0
    first = jobs["first"]
    run_sizes = [run["replicas"] for run in first["runs"]]
    assert _went_up_then_down(run_sizes), (first["runs"], first["history"])
    assert first["resizes"] >= 2, first
    # What a restart cost it, measured from its runs, is what the policy charged it for.
    losses = restart_losses(first["run_details"])
    assert len(losses) >= 3 and first["restart_seconds"] == pytest.approx(
        sum(losses) / len(losses))
    # It was resized while training: later attempts resumed from a checkpoint.
    assert "restored at step" in service.log_text("first")
    cluster = service.get("/api/cluster")
    assert cluster["nodes"][0]["used"] == 0
    kinds = {e["kind"] for e in service.get("/api/events", job="first")}
    assert {"submitted", "restarting", "running", "finished"} <= kinds


def test_killed_replica_resumes_from_checkpoint(service: Service) -> None:
    crashy = job_yaml("crashy", epochs=4, sleep=0.1, max_replicas=1)
    assert service.submit(crashy).status_code == 201
    checkpoint = service.home / "checkpoints" / "crashy" / "state.pt"

    def trained_and_checkpointed() -> bool:
        job = service.job("crashy")
        return job["state"] == "running" and job.get("steps", 0) > 0 and checkpoint.exists()

    wait_until(trained_and_checkpointed, 90, "a checkpoint", service.diagnostics)
    pid = service.job("crashy")["replica_pids"][0]
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: all_done(service, ["crashy"]), 120, "crashy to finish",
               service.diagnostics)
    job = service.job("crashy")
    assert job["state"] == "finished", job.get("failure")
    assert job["attempt"] >= 2 and job["crashes"] == 0
    log = service.log_text("crashy")
    assert "attempt 2" in log and "restored at step" in log
    # The retry is the job's own restart, not a resize: `shoal show` counts it apart.
    shown = CliRunner().invoke(cli, ["show", "crashy", "--home", str(service.home)])
    assert shown.exit_code == 0 and "crash retries 1" in shown.output, shown.output
    done = json.loads((checkpoint.parent / "done.json").read_text())
    assert done["pid"] != pid


def test_crashing_job_fails_after_bounded_retries(service: Service) -> None:
    text = ('name: broken\napplication: x\n'
            'command: ["python", "-c", "import sys; print(\'boom\'); sys.exit(7)"]\n')
    assert service.submit(text).status_code == 201
    wait_until(lambda: all_done(service, ["broken"]), 60, "broken to fail", service.diagnostics)
    job = service.job("broken")
    assert job["state"] == "failed"
    assert "exited with code 7" in job["failure"] and "gave up after 2 restarts" in job["failure"]
    assert "boom" in job["failure"]
    assert Path(service.home / "logs" / "broken" / "rank0.log").read_text().count("boom") == 3
