"""A Ray Serve-style autoscaler for one model in the request-level simulator.

Every control interval the desired replica count is ``ceil(ongoing / target_ongoing_requests)``
(ongoing = queued + executing requests over all replicas), clipped to ``[min, max]``. The
count goes up only after the desire to go up has held for ``upscale_delay_s`` and down only
after the desire to go down has held for ``downscale_delay_s`` (Ray Serve's
``target_ongoing_requests``, ``upscale_delay_s``, ``downscale_delay_s``, ``min_replicas``,
``max_replicas``). Each replica is one device group; new replicas pay the model's cold start.
Devices come from a free pool first, then (optionally) from elastic training jobs through a
:class:`~shoal.serve.colocation.TrainingLender`, and borrowed devices are given back first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from shoal.serve.colocation import ElasticTrainingJob, TrainingLender
from shoal.serve.hardware import Device
from shoal.serve.profiles import GroupSpec, LatencyModel
from shoal.serve.sim.engine import Engine, SimGroup
from shoal.serve.sim.run import LatencyCache, ReplicaGroup, sim_group


@dataclass(frozen=True)
class AutoscalingConfig:
    target_ongoing_requests: float = 2.0
    min_replicas: int = 1
    max_replicas: int = 16
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0

    def desired(self, ongoing: int) -> int:
        want = math.ceil(ongoing / self.target_ongoing_requests)
        return max(self.min_replicas, min(self.max_replicas, want))


@dataclass
class _Replica:
    group: SimGroup
    device: Device
    lender_job: ElasticTrainingJob | None


@dataclass
class Autoscaler:
    """Engine controller that scales replicas of ``model`` on single devices."""

    model: int
    config: AutoscalingConfig
    free_devices: list[Device]
    latency: LatencyModel
    cache: LatencyCache
    lender: TrainingLender | None = None
    replicas: list[_Replica] = field(default_factory=list)
    history: list[tuple[float, int]] = field(default_factory=list)  # (time, replicas)
    _up_since: float | None = None
    _down_since: float | None = None

    def __call__(self, now: float, engine: Engine) -> None:
        if not self.replicas:
            for _ in range(self.config.min_replicas):
                self._add(now, engine, cold=False)
        ongoing = sum(engine.ongoing(r.group) for r in self.replicas)
        want = self.config.desired(ongoing)
        have = len(self.replicas)
        if want > have:
            self._down_since = None
            self._up_since = now if self._up_since is None else self._up_since
            if now - self._up_since >= self.config.upscale_delay_s:
                for _ in range(want - have):
                    if not self._add(now, engine, cold=True):
                        break
                self._up_since = None
        elif want < have:
            self._up_since = None
            self._down_since = now if self._down_since is None else self._down_since
            if now - self._down_since >= self.config.downscale_delay_s:
                for _ in range(have - want):
                    self._remove(now, engine)
                self._down_since = None
        else:
            self._up_since = self._down_since = None
        self.history.append((now, len(self.replicas)))

    def _add(self, now: float, engine: Engine, cold: bool) -> bool:
        lender_job = None
        if self.free_devices:
            device = self.free_devices.pop()
        elif self.lender is not None and (lender_job := self.lender.borrow(now)) is not None:
            device = Device(-1 - len(engine.groups), -1, self._hardware())
        else:
            return False
        spec = GroupSpec((device,), 1, 1)
        group = sim_group(ReplicaGroup(spec, (self.model,)), self.latency, self.cache.workload,
                          name=f"replica@{now:.1f}", started_at=now, cold=cold, cache=self.cache)
        self.replicas.append(_Replica(engine.add_group(group), device, lender_job))
        return True

    def _hardware(self):
        return (self.replicas[0].device.hardware if self.replicas
                else self.free_devices[0].hardware)

    def _remove(self, now: float, engine: Engine) -> None:
        # Borrowed devices go back first; among those, the least busy replica.
        replica = min(self.replicas, key=lambda r: (r.lender_job is None,
                                                    engine.ongoing(r.group)))
        self.replicas.remove(replica)
        engine.retire_group(replica.group)
        if replica.lender_job is not None and self.lender is not None:
            self.lender.give_back(replica.lender_job, now)
        else:
            self.free_devices.append(replica.device)
