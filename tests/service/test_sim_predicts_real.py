"""The simulator, given the profiles a real run measured, predicts the run's average JCT.

Three staggered jobs run for real on the local service (2 CPU slots, the pollux policy): the
first one alone long enough to grow to 2 replicas, the others arriving once it has. The run is
then exported (shoal.service.replay) and replayed by the simulator with the same scheduler core,
policy, rounds, arrivals and the restart costs measured on the run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from shoal.cli.main import cli
from shoal.service.replay import compare, export_run, simulate_run
from tests.service.helpers import all_done, running_service, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.realtime]

TOLERANCE = 0.20


def _job(name: str, epochs: int, samples: int, seed: int) -> str:
    return (
        f"name: {name}\napplication: mix\nbatch_size: 16\nmax_replicas: 2\n"
        f"target_epochs: {epochs}\n"
        f'command: ["python", "tests/service/mix_job.py", "--epochs", "{epochs}", '
        f'"--samples", "{samples}", "--seed", "{seed}"]\n'
    )


def _trained_on_two(jobs: list[dict]) -> bool:
    return any(row["num_replicas"] == 2 for row in jobs[0].get("profile") or [])


def test_simulator_predicts_average_jct_of_a_real_run(tmp_path: Path) -> None:
    options = {"interval": 1.0, "restart_delay": 2.0, "checkpoint_interval": 30.0}
    with running_service(tmp_path / "home", **options) as service:
        assert service.submit(_job("grows", 8, 1024, 0)).status_code == 201
        # Let the first job grow (it is alone on 2 slots); on a very slow machine go on anyway.
        deadline = time.monotonic() + 90
        while not _trained_on_two(service.jobs()) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert service.submit(_job("second", 4, 512, 1)).status_code == 201
        time.sleep(5)
        assert service.submit(_job("third", 4, 512, 2)).status_code == 201
        names = ["grows", "second", "third"]
        wait_until(lambda: all_done(service, names), 300, "every job to finish",
                   service.diagnostics)
        jobs, cluster = service.jobs(), service.get("/api/cluster")
        finished = [j["state"] for j in jobs] == ["finished"] * 3
        assert finished, service.diagnostics()  # while the service still answers
        # The same export and replay from the command line, straight from the service.
        replayed = CliRunner().invoke(cli, [
            "replay", "--export", str(tmp_path / "cli-export"), "--home", str(service.home),
            "--json", str(tmp_path / "replay.json")])
        assert replayed.exit_code == 0, replayed.output

    run = export_run(jobs, cluster, tmp_path / "profiles")
    assert sorted(p.name for p in (tmp_path / "profiles").iterdir() if p.is_dir()) == sorted(names)
    assert run.costs.count_starts == 3 and run.policy == "pollux"
    result = simulate_run(run)
    report = compare(run, result)
    print(json.dumps(report, indent=1))  # shown with pytest -s
    assert report["sim_avg_jct_s"] is not None, report
    assert abs(report["error"]) <= TOLERANCE, json.dumps(report, indent=1)
    from_cli = json.loads((tmp_path / "replay.json").read_text())["replays"]["pollux"]
    assert from_cli["sim_avg_jct_s"] == pytest.approx(report["sim_avg_jct_s"])
