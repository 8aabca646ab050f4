"""Optimus (EuroSys'18) with oracle knowledge of remaining work, as in the Pollux artifact.

Each job runs at its user batch size. Every job gets one device, then devices go one at a time
to the job whose predicted remaining time drops the most from one more replica:
``(step_time(n) - step_time(n + 1)) * remaining_iterations``. With a simulator, step times and
remaining iterations are the true ones (the oracle); otherwise the job's fitted model is used.

On a mixed cluster a job's devices share one type, which Optimus does not choose by speed: a
job keeps its current type while it has a free device, else takes the type with the most free
devices per job already on it (so that every type's devices find jobs), and grows only within
that type's free devices.
"""

from __future__ import annotations

from collections.abc import Sequence

from shoal.core.types import ClusterState, Decision, Grant, JobView
from shoal.policy.fixed_size import allowed_types


def _max_replicas(job: JobView, largest_type: int) -> int:
    """A job's devices share one type, so it can use at most the largest type's count."""
    batch = job.spec.batch_size or job.limits.init_batch_size
    return min(batch // job.limits.min_local_bsz, job.limits.max_replicas, largest_type)


def _step_time(job: JobView, replicas: int) -> float:
    batch = job.spec.batch_size or job.limits.init_batch_size
    if job.oracle is not None:
        return job.oracle.step_time(replicas, batch)
    model = next(iter(job.hints.goodput.values()), None)
    if model is None:
        return 1.0 / replicas
    nodes = 1 if replicas <= 4 else -(-replicas // 4)
    return batch / float(model.throughput(nodes, replicas, batch / replicas, 0))


def _remaining(job: JobView) -> float:
    batch = job.spec.batch_size or job.limits.init_batch_size
    if job.oracle is not None:
        return job.oracle.remaining_iterations(batch)
    return max(1.0 - job.hints.progress, 1e-3)


class OptimusPolicy:
    name = "optimus"
    adapts_batch_size = False
    decides_on_arrival = False
    decides_on_completion = False

    def decide(self, jobs: Sequence[JobView], cluster: ClusterState, now: float) -> Decision:
        capacity = {t: cluster.capacity(t) for t in cluster.device_types}
        free = dict(capacity)
        remaining = {j.name: _remaining(j) for j in jobs}
        replicas: dict[str, int] = {}
        device_type: dict[str, str] = {}
        gain: dict[str, float] = {}

        def marginal(job: JobView) -> float:
            n, dtype = replicas[job.name], device_type[job.name]
            if n + 1 > _max_replicas(job, capacity[dtype]) or free[dtype] < 1:
                return 0.0
            return (_step_time(job, n) - _step_time(job, n + 1)) * remaining[job.name]

        jobs_on = dict.fromkeys(free, 0)
        for job in jobs:
            dtype = _first_type(job, free, jobs_on)
            if dtype is None:
                continue
            replicas[job.name], device_type[job.name] = 1, dtype
            free[dtype] -= 1
            jobs_on[dtype] += 1
            gain[job.name] = marginal(job)
        by_name = {j.name: j for j in jobs}
        while gain and max(gain.values()) > 0:
            key = max(gain, key=lambda k: gain[k])
            if free[device_type[key]] < 1:  # its type filled up since its gain was computed
                gain[key] = 0.0
                continue
            replicas[key] += 1
            free[device_type[key]] -= 1
            gain[key] = marginal(by_name[key])
        order = sorted(replicas, key=lambda name: replicas[name])
        return {name: Grant(replicas[name], device_type[name],
                            batch_size=by_name[name].spec.batch_size) for name in order}


def _first_type(job: JobView, free: dict[str, int], jobs_on: dict[str, int]) -> str | None:
    """The type a job's first device comes from: its current type while that has a free
    device, else the allowed type with the most free devices per job already on it; None if
    no allowed type has a free device."""
    allowed = [t for t in allowed_types(job, list(free)) if free[t] > 0]
    current = job.allocation.device_type if job.allocation is not None else None
    if current in allowed:
        return current
    return max(allowed, key=lambda t: free[t] / (1 + jobs_on[t]), default=None)
