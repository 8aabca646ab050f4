"""On a GPU machine each job sees its own GPUs, never another running job's."""

from __future__ import annotations

from pathlib import Path

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
