"""On the Ray backend, a policy that decides at completions hands a finished job's devices out
when the job ends, not at the next round."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.ray.cluster import LoopbackCluster
from tests.ray.test_service import events, first_time, ray_job
from tests.service.helpers import running_service, wait_until

pytestmark = pytest.mark.slow


def test_a_finished_jobs_device_goes_to_a_waiting_job_without_waiting_for_the_round(
        ray_cluster: LoopbackCluster, tmp_path: Path) -> None:
    # One "fast" device in the cluster; the first job holds it and may not be preempted.
    ahead = ray_job("ahead", ["fast"], epochs=3, sleep=0.1) + "rigid: true\npreemptible: false\n"
    behind = ray_job("behind", ["fast"], epochs=2, sleep=0.05)
    # Rounds every 10 minutes: only the arrival and the completion can place the jobs.
    with running_service(tmp_path / "home", address=ray_cluster.address, backend="ray",
                         policy="shoal", interval=600.0,
                         checkpoint_dir=str(tmp_path / "checkpoints")) as service:
        time.sleep(1.0)  # the first round has run on an empty cluster
        assert service.submit(ahead).status_code == 201
        wait_until(lambda: service.job("ahead")["state"] in ("restarting", "running"), 60,
                   "the first job placed at its arrival", service.diagnostics)
        assert service.submit(behind).status_code == 201
        time.sleep(1.0)
        assert service.job("behind")["state"] == "pending"
        wait_until(lambda: service.job("ahead")["state"] == "finished", 120,
                   "the first job finished", service.diagnostics)
        wait_until(lambda: service.job("behind")["state"] == "finished", 120,
                   "the waiting job ran when the first one finished", service.diagnostics)
        # "restarting": placed and starting (a round may not see it running before it ends)
        waited = (first_time(events(service, "behind"), "restarting")
                  - first_time(events(service, "ahead"), "finished"))
        assert 0 <= waited < 30, waited
