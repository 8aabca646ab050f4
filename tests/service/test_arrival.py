"""The service decides when a job arrives for a policy that asks for it, not a round later."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.service.helpers import job_yaml, running_service, wait_until


def test_a_submitted_job_is_placed_without_waiting_for_the_next_round(tmp_path: Path) -> None:
    # Rounds every 10 minutes: only the arrival can place the job within the test.
    with running_service(tmp_path / "home", policy="shoal", interval=600.0) as service:
        time.sleep(1.0)  # the service's first round has run on an empty cluster
        assert service.submit(job_yaml("early", epochs=50)).status_code == 201
        wait_until(lambda: service.job("early")["state"] in ("restarting", "running"), 30,
                   "the job placed at its arrival", service.diagnostics)
        service.http.post(f"{service.url}/api/jobs/early/cancel").raise_for_status()


def test_a_finished_jobs_devices_go_to_a_waiting_job_without_waiting_for_the_next_round(
        tmp_path: Path) -> None:
    # The first job holds both slots and may not be preempted, so the second waits for it.
    ahead = (job_yaml("ahead", epochs=12, sleep=0.1)
             + "num_replicas: 2\nrigid: true\npreemptible: false\n")
    with running_service(tmp_path / "home", policy="shoal", interval=600.0) as service:
        time.sleep(1.0)
        assert service.submit(ahead).status_code == 201
        wait_until(lambda: service.job("ahead")["state"] in ("restarting", "running"), 30,
                   "the first job placed", service.diagnostics)
        assert service.submit(job_yaml("behind", epochs=50)).status_code == 201
        time.sleep(1.0)
        behind = service.job("behind")
        assert behind["state"] == "pending"
        assert behind["queued_seconds"] >= 1.0  # waiting so far, while it waits
        wait_until(lambda: service.job("ahead")["state"] == "finished", 120,
                   "the first job finished", service.diagnostics)
        wait_until(lambda: service.job("behind")["state"] in ("restarting", "running"), 30,
                   "the waiting job placed when the first one finished", service.diagnostics)
        # Once placed, the wait stops growing: it is the time from submission to the start.
        behind, ahead = service.job("behind"), service.job("ahead")
        assert behind["queued_seconds"] == pytest.approx(
            behind["start_time"] - behind["submit_time"])
        assert behind["start_time"] >= ahead["finish_time"]
        assert ahead["queued_seconds"] == pytest.approx(ahead["start_time"] - ahead["submit_time"])
        service.http.post(f"{service.url}/api/jobs/behind/cancel").raise_for_status()
