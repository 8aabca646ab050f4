"""Optimus (EuroSys'18) with oracle knowledge of remaining work, as in the Pollux artifact.

Each job runs at its user batch size. Every job gets one device, then devices go one at a time
to the job whose predicted remaining time drops the most from one more replica:
``(step_time(n) - step_time(n + 1)) * remaining_iterations``. With a simulator, step times and
remaining iterations are the true ones (the oracle); otherwise the job's fitted model is used.
"""

from __future__ import annotations

from collections.abc import Sequence

from shoal.core.types import ClusterState, Decision, Grant, JobView


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
        free = cluster.capacity()
        largest = max(cluster.capacity(t) for t in cluster.device_types)
        remaining = {j.name: _remaining(j) for j in jobs}
        replicas: dict[str, int] = {}
        gain: dict[str, float] = {}

        def marginal(job: JobView) -> float:
            n = replicas[job.name]
            if n + 1 > _max_replicas(job, largest) or free < 1:
                return 0.0
            return (_step_time(job, n) - _step_time(job, n + 1)) * remaining[job.name]

        for job in jobs:
            if free < 1:
                replicas[job.name] = 0
                gain[job.name] = 0.0
                continue
            replicas[job.name] = 1
            free -= 1
            gain[job.name] = marginal(job)
        by_name = {j.name: j for j in jobs}
        while free > 0 and gain and max(gain.values()) > 0:
            key = max(gain, key=lambda k: gain[k])
            replicas[key] += 1
            gain[key] = marginal(by_name[key])
            free -= 1
        order = sorted(jobs, key=lambda j: replicas[j.name])
        return {
            j.name: Grant(replicas[j.name], batch_size=j.spec.batch_size)
            for j in order
            if replicas[j.name] > 0
        }
