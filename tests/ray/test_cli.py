"""``shoal up --backend ray`` without an address: the service starts its own one-node Ray
cluster, runs the same workload to the same completed jobs as the local backend, and stops the
cluster at ``shoal down``."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from shoal.cli.main import cli
from shoal.service.config import read_info
from tests.ray.cluster import RAY_ENV, end_session, session_pids
from tests.service.helpers import REPO, all_done, job_yaml, running_service, wait_until

pytestmark = pytest.mark.slow

WORKLOAD = {name: job_yaml(name, epochs=2, sleep=0.02, max_replicas=1)
            for name in ("demo-a", "demo-b")}


@pytest.fixture
def ray_dir() -> Iterator[Path]:
    """Ray's session folder for the cluster the service starts (short: sockets live there)."""
    folder = Path(tempfile.mkdtemp(prefix="shoal-ray-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_up_ray_runs_the_local_workload_and_down_stops_its_cluster(
        tmp_path: Path, ray_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray")
    for key, value in RAY_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SHOAL_RAY_NODE_IP", "127.0.0.4")  # Ray rewrites 127.0.0.1
    monkeypatch.setenv("SHOAL_RAY_TEMP_DIR", str(ray_dir))
    monkeypatch.chdir(REPO)  # jobs run in the submitting directory
    home = str(tmp_path / "home")
    runner = CliRunner()

    def shoal(*args: str) -> str:
        result = runner.invoke(cli, [*args, "--home", home])
        assert result.exit_code == 0, result.output
        return result.output

    shoal("up", "--backend", "ray", "--slots", "2", "--interval", "1",
          "--checkpoint-interval", "2", "--policy", "fifo")
    info = read_info(Path(home))
    assert info is not None
    service_pid = int(info["pid"])  # type: ignore[call-overload]
    try:
        files = []
        for name, text in WORKLOAD.items():
            files.append(tmp_path / f"{name}.yaml")
            files[-1].write_text(text)
        assert "submitted demo-b" in shoal("submit", *map(str, files))
        with running_service(tmp_path / "local-home", policy="fifo") as local:
            for text in WORKLOAD.values():
                assert local.submit(text).status_code == 201

            def ray_done() -> bool:
                jobs = json.loads(shoal("ls", "--json"))
                return all(j["state"] in ("finished", "failed") for j in jobs)

            wait_until(ray_done, 150, "the workload on Ray",
                       lambda: (Path(home) / "service.log").read_text(errors="replace")[-3000:])
            wait_until(lambda: all_done(local, list(WORKLOAD)), 150, "the workload, locally",
                       local.diagnostics)
            outcome = {"local": {j["name"]: (j["state"], _samples(local.home, j["name"]))
                                 for j in local.jobs()}}
        outcome["ray"] = {j["name"]: (j["state"], _samples(Path(home), j["name"]))
                          for j in json.loads(shoal("ls", "--json"))}
        assert outcome["ray"] == outcome["local"] == {n: ("finished", 512) for n in WORKLOAD}
        for name in WORKLOAD:  # the replicas ran in the Ray cluster the service started
            log = (Path(home) / "logs" / name / "rank0.log").read_text()
            assert "(127.0.0.4)" in log and "epoch 1 done" in log
        cluster = httpx.get(f"{info['url']}/api/cluster", timeout=30).json()
        assert "1 node(s), 2 cpu" in cluster["pool"], cluster
        assert "Ray cluster 127.0.0.4" in shoal("top", "--once")
        assert session_pids(service_pid), "the service and its Ray cluster run"
    finally:
        shoal("down")
        # The service stopped its Ray cluster with it: nothing of its session is left.
        try:
            wait_until(lambda: not session_pids(service_pid), 30, "the local Ray cluster to stop")
        finally:
            end_session(service_pid)


def _samples(home: Path, name: str) -> int:
    return int(json.loads((home / "checkpoints" / name / "done.json").read_text())["samples"])
