"""First in, first out: each job runs at its own size (capped at the largest device type it may
use), in submission order, never preempted."""

from __future__ import annotations

from collections.abc import Sequence

from shoal.core.types import ClusterState, Decision, Grant, JobView
from shoal.policy.fixed_size import fitted_size


class FifoPolicy:
    name = "fifo"
    adapts_batch_size = False
    decides_on_arrival = False
    decides_on_completion = False

    def __init__(self, backfill: bool = False):
        self.backfill = backfill

    def decide(self, jobs: Sequence[JobView], cluster: ClusterState, now: float) -> Decision:
        free = cluster.capacity()
        decision: Decision = {}
        for job in jobs:
            if job.allocation is not None:
                decision[job.name] = Grant(job.allocation.num_replicas,
                                           batch_size=job.spec.batch_size)
                free -= job.allocation.num_replicas
        blocked = False
        for job in sorted(jobs, key=lambda j: (j.submit_time, j.name)):
            if job.allocation is not None:
                continue
            want = fitted_size(job, cluster, min(job.spec.num_replicas, job.limits.max_replicas))
            if not blocked and want <= free:
                decision[job.name] = Grant(want, batch_size=job.spec.batch_size)
                free -= want
            elif not self.backfill:
                blocked = True
        return decision
