"""First in, first out: each job runs at its own size (capped at the largest device type it may
use), on one device type, in submission order, never preempted."""

from __future__ import annotations

from collections.abc import Sequence

from shoal.core.types import ClusterState, Decision, Grant, JobView
from shoal.policy.fixed_size import FreeByType, requested_size


class FifoPolicy:
    name = "fifo"
    adapts_batch_size = False
    decides_on_arrival = False
    decides_on_completion = False

    def __init__(self, backfill: bool = False):
        self.backfill = backfill

    def decide(self, jobs: Sequence[JobView], cluster: ClusterState, now: float) -> Decision:
        free = FreeByType(cluster)
        decision: Decision = {}
        for job in jobs:
            if job.allocation is not None:
                decision[job.name] = Grant(job.allocation.num_replicas,
                                           job.allocation.device_type,
                                           batch_size=job.spec.batch_size)
                free.hold(job)
        blocked = False
        for job in sorted(jobs, key=lambda j: (j.submit_time, j.name)):
            if job.allocation is not None:
                continue
            want = requested_size(job, cluster)
            device_type = None if blocked else free.take(job, want)
            if device_type is not None:
                decision[job.name] = Grant(want, device_type, batch_size=job.spec.batch_size)
            elif not self.backfill:
                blocked = True
        return decision
