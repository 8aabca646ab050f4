"""Resizes on the local backend pre-warm the new replicas while the old ones keep training."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from shoal.backends.local.devices import DevicePool
from shoal.backends.local.job import EXIT_CHECKPOINTED, LocalJob, Phase, RunSettings
from shoal.backends.local.model import JobModel
from shoal.core.types import Allocation, JobLimits
from shoal.spec.job import load_job_yaml
from tests.service.helpers import REPO

pytestmark = pytest.mark.slow

ONE, TWO = Allocation("cpu", (0,)), Allocation("cpu", (0, 0))


def _job(home: Path, epochs: int) -> LocalJob:
    spec = load_job_yaml(
        f"name: warm\napplication: tiny\nbatch_size: 16\n"
        f'command: ["python", "tests/local/tiny_job.py", "--epochs", "{epochs}", '
        f'"--sleep", "0.05"]\n'
    )
    settings = RunSettings(home=home, pool=DevicePool("cpu", 2, 1), checkpoint_interval_s=600)
    return LocalJob(spec, REPO, JobLimits(16, 16, 1, 16, 2), settings,
                    JobModel.for_spec("cpu", spec))


def _log(job: LocalJob) -> str:
    path = job.log_dir / "rank0.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _tick_until(job: LocalJob, condition: Callable[[], bool], timeout_s: float,
                what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        job.tick(time.time())
        if job.phase == Phase.FAILED:
            raise AssertionError(f"{what}: the job failed: {job.failed_reason}")
        if time.monotonic() > deadline:
            logs = "\n".join(p.read_text() for p in sorted(job.log_dir.glob("*.log")))
            raise AssertionError(f"timed out waiting for {what}\n{logs[-3000:]}")
        time.sleep(0.05)


def _stop(job: LocalJob) -> None:
    job.cancel()
    deadline = time.monotonic() + 60
    while not job.terminal and time.monotonic() < deadline:
        job.tick(time.time())
        time.sleep(0.1)


def test_resize_starts_new_replicas_before_stopping_the_old(tmp_path: Path) -> None:
    job = _job(tmp_path, epochs=12)
    try:
        job.set_target(ONE, None)
        job.tick(time.time())
        _tick_until(job, lambda: "epoch 0 done" in _log(job), 120, "the job to train")
        old = list(job.replicas)
        job.set_target(TWO, None)
        # The new replicas start next to the running one, which is not asked to stop yet.
        assert len(job.standby) == 2 and job.phase == Phase.RUNNING
        assert all(r.exit_code() is None for r in old)
        _tick_until(job, lambda: len(job.run_details) == 2, 180, "the resize")
        assert [r.exit_code() for r in old] == [EXIT_CHECKPOINTED]
        first, second = job.run_details
        assert first["kind"] == "start" and first["replicas"] == 1
        assert second["kind"] == "resize" and second["replicas"] == 2
        assert second["requested"] < second["time"]
        assert job.running_allocation == TWO and job.resizes == 1 and not job.standby
        _tick_until(job, lambda: job.phase == Phase.FINISHED, 180, "the job to finish")
        done = json.loads((job.checkpoint_dir / "done.json").read_text())
        assert done["world_size"] == 2
        logs = (job.log_dir / "rank0.log").read_text()
        assert "pre-warmed while the running replicas train" in logs
        assert "restored at step" in logs
    finally:
        _stop(job)


def test_a_resize_taken_back_drops_the_warm_replicas(tmp_path: Path) -> None:
    job = _job(tmp_path, epochs=3)
    try:
        job.set_target(ONE, None)
        job.tick(time.time())
        old = list(job.replicas)
        job.set_target(TWO, None)
        warm = list(job.standby)
        assert len(warm) == 2
        job.set_target(ONE, None)  # the scheduler changed its mind before the resize happened
        assert not job.standby and job.phase == Phase.RUNNING
        _tick_until(job, lambda: all(r.exit_code() is not None for r in warm), 30,
                    "the warm replicas to be killed")
        _tick_until(job, lambda: job.phase == Phase.FINISHED, 180, "the job to finish")
        # The running replica was never asked to stop: it trained to the end.
        assert [r.exit_code() for r in old] == [0]
        assert len(job.run_details) == 1 and job.resizes == 0
    finally:
        _stop(job)
