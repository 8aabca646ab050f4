"""Tiresias (NSDI'19), discretized two-queue least-attained-service, as in the Pollux artifact.

Jobs run at their user-given size (within their replica bound, capped at the largest device type
they may use) and batch. A job starts in queue 0 and is demoted to queue 1 once its attained
service (run time x devices) reaches 16 device-hours. Every round, queue 0 then queue 1, each in
arrival order, are admitted while their full size fits on one device type they may use (their
current type first); admitted jobs that were running keep their devices, the others are
preempted.
"""

from __future__ import annotations

from collections.abc import Sequence

from shoal.core.types import ClusterState, Decision, Grant, JobView
from shoal.policy.fixed_size import FreeByType, requested_size


class TiresiasPolicy:
    name = "tiresias"
    adapts_batch_size = False
    decides_on_arrival = False
    decides_on_completion = False

    def __init__(self, queue_threshold: float = 3600 * 16):
        self.queue_threshold = queue_threshold
        self._queues: tuple[list[str], list[str]] = ([], [])
        self._running: dict[str, bool] = {}
        self._last_check: dict[str, int] = {}
        self._executed: dict[str, int] = {}

    def decide(self, jobs: Sequence[JobView], cluster: ClusterState, now: float) -> Decision:
        tick = int(now)
        by_name = {j.name: j for j in jobs}
        q0, q1 = self._queues
        q0[:] = [k for k in q0 if k in by_name]
        q1[:] = [k for k in q1 if k in by_name]
        self._running = {k: v for k, v in self._running.items() if k in by_name}
        for job in jobs:
            if job.name not in self._running:
                self._running[job.name] = False
                self._last_check[job.name] = 0
                self._executed[job.name] = 0
                q0.append(job.name)
        for job in jobs:
            key = job.name
            if self._running[key]:
                self._executed[key] += tick - self._last_check[key]
                if key in q0 and self._executed[key] * job.spec.num_replicas >= (
                    self.queue_threshold
                ):
                    q0.remove(key)
                    q1.append(key)
            self._last_check[key] = tick
        free = FreeByType(cluster)
        decision: Decision = {}
        for queue in (q0, q1):
            for key in queue:
                want = requested_size(by_name[key], cluster)
                device_type = free.take(by_name[key], want)
                self._running[key] = device_type is not None
                if device_type is not None:
                    decision[key] = Grant(want, device_type,
                                          batch_size=by_name[key].spec.batch_size)
        return decision
