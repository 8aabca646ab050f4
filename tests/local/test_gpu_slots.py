"""On a GPU machine each job sees its own GPUs, never another running job's."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from shoal.backends.local.backend import LocalBackend
from shoal.backends.local.devices import DevicePool
from shoal.backends.local.job import RunSettings
from shoal.core.types import Allocation, Change
from shoal.spec import JobSpec


def _visible(backend: LocalBackend, name: str, replicas: int) -> list[str]:
    job = backend.jobs[name]
    alloc = Allocation("gpu", (0,) * replicas)
    return [job.contract_environment(alloc, rank, 29500)["CUDA_VISIBLE_DEVICES"]
            for rank in range(replicas)]


def test_jobs_get_disjoint_gpus_and_reuse_what_a_stopped_job_freed(tmp_path: Path) -> None:
    pool = DevicePool("gpu", slots=4, threads_per_slot=1, gpu_ids=(3, 5, 6, 7))
    backend = LocalBackend(RunSettings(home=tmp_path, pool=pool))
    for name in ("a", "b", "c"):
        spec = JobSpec(name=name, application="custom", command=["python", "train.py"])
        backend.admit(spec, tmp_path)
    two = Allocation("gpu", (0, 0))
    backend.assign_slots([Change("a", two), Change("b", two)])
    assert _visible(backend, "a", 2) == ["3,5", "3,5"]  # all ranks see the job's GPUs
    assert _visible(backend, "b", 2) == ["6,7", "6,7"]
    # "a" stops; "c" gets its GPUs while "b" keeps its own.
    backend.assign_slots([Change("a", None), Change("c", two)])
    assert _visible(backend, "c", 2) == ["3,5", "3,5"]
    assert _visible(backend, "b", 2) == ["6,7", "6,7"]
    # "b" shrinks to one GPU: it takes the lowest free one, never one "c" holds.
    backend.assign_slots([Change("b", Allocation("gpu", (0,)))])
    assert _visible(backend, "b", 1) == ["6"]


@pytest.mark.parametrize("slots_recorded", [True, False])
def test_a_restarted_service_keeps_adopted_jobs_on_their_gpus(tmp_path: Path,
                                                               slots_recorded: bool) -> None:
    """Without recorded slots (state written before slots were recorded), the job's processes
    were started on the first GPUs: the adopting service records those as held, not free."""
    pool = DevicePool("gpu", slots=4, threads_per_slot=1, gpu_ids=(0, 1, 2, 3))
    settings = RunSettings(home=tmp_path, pool=pool)
    sleeper = JobSpec(name="a", application="custom",
                      command=["python", "-c", "import time; time.sleep(60)"])
    first = LocalBackend(settings)
    limits = first.admit(sleeper, tmp_path)
    try:
        first.apply([Change("a", Allocation("gpu", (0, 0)))])  # starts two real processes
        assert first.jobs["a"].slot_ids == (0, 1)
        if not slots_recorded:
            run_file = first.jobs["a"].run_dir / "run.json"
            state = json.loads(run_file.read_text())
            del state["slot_ids"]
            run_file.write_text(json.dumps(state))
        # A new service adopts the running processes and their GPUs.
        second = LocalBackend(settings)
        adopted = second.adopt(sleeper, tmp_path, limits)
        assert adopted.replicas and adopted.slot_ids == (0, 1)
        second.admit(JobSpec(name="c", application="custom", command=["python", "x.py"]),
                     tmp_path)
        second.assign_slots([Change("c", Allocation("gpu", (0, 0)))])
        assert second.jobs["c"].slot_ids == (2, 3)
    finally:
        for replica in first.jobs["a"].replicas:
            replica.signal(signal.SIGKILL)
