"""The service dies or stops while jobs train: every job still finishes exactly once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.service.helpers import all_done, job_yaml, running_service, wait_until

pytestmark = pytest.mark.slow


def _attempt_headers(home: Path, name: str) -> int:
    return (home / "logs" / name / "rank0.log").read_text().count("=== shoal: attempt")


def test_killed_then_stopped_service_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    names = ["alpha", "beta"]
    with running_service(home) as service:
        for name in names:
            text = job_yaml(name, epochs=8, sleep=0.1, max_replicas=1)
            assert service.submit(text).status_code == 201

        def steps(name: str) -> int:
            return int(service.job(name).get("steps") or 0)

        wait_until(lambda: all(steps(n) > 0 for n in names), 90, "both jobs to train",
                   service.diagnostics)

        # 1. SIGKILL: the replicas outlive the service and are re-adopted by the next one.
        service.kill()
        service.start()
        assert [j["name"] for j in service.jobs()] == names
        for name in names:
            assert service.job(name)["phase"] == "running", service.diagnostics()
        before = {n: steps(n) for n in names}
        wait_until(lambda: all(steps(n) > before[n] for n in names), 60,
                   "adopted jobs to report again", service.diagnostics)
        assert {n: service.job(n)["attempt"] for n in names} == {"alpha": 1, "beta": 1}

        # 2. A clean stop checkpoints the jobs; the next start resumes them from there.
        service.stop()
        service.start()
        assert [j["name"] for j in service.jobs()] == names
        wait_until(lambda: all_done(service, names), 120, "all jobs to finish",
                   service.diagnostics)
        for name in names:
            job = service.job(name)
            assert job["state"] == "finished", (job.get("failure"), service.log_text(name))
            log = service.log_text(name)
            assert "restored at step" in log
            assert _attempt_headers(home, name) == job["attempt"] == 2
            done = json.loads((home / "checkpoints" / name / "done.json").read_text())
            assert done["steps"] >= 8 * 16  # 256 samples / batch 16, every epoch complete
        assert len(service.jobs()) == len(names)

        # 3. Finished jobs keep the restart cost measured from their runs across a restart.
        costs = {n: service.job(n)["restart_seconds"] for n in names}
        assert all(cost is not None and cost > 0 for cost in costs.values()), costs
        service.stop()
        service.start()
        assert {n: service.job(n)["restart_seconds"] for n in names} == pytest.approx(costs)
