"""Run a static placement through the engine."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shoal.serve.hardware import Hardware
from shoal.serve.profiles import BatchLatency, GroupSpec, LatencyModel
from shoal.serve.sim.engine import BatchingConfig, Engine, SimGroup, SimResult, alone_times
from shoal.serve.sim.metrics import summarize_requests
from shoal.serve.sim.workload import Workload


@dataclass(frozen=True)
class ReplicaGroup:
    """A device group and the models it holds (each model split over all its devices)."""

    spec: GroupSpec
    models: tuple[int, ...]


Placement = list[ReplicaGroup]


def deadlines(workload: Workload, latency: LatencyModel, slo_scale: float,
              reference: Hardware) -> np.ndarray:
    """Deadline = arrival + ``slo_scale`` x the request's latency alone on one reference device."""
    return workload.arrival_s + slo_scale * latency.reference_latency(workload, reference)


class LatencyCache:
    """Batch-latency functions and alone-latency lists per (group shape, model), shared by the
    many simulations of one placement search over one workload."""

    def __init__(self, latency: LatencyModel, workload: Workload):
        self.latency = latency
        self.workload = workload
        self._fns: dict[tuple, BatchLatency] = {}
        self._alone: dict[tuple, list[float]] = {}

    def batch(self, model: int, spec: GroupSpec) -> BatchLatency:
        key = (spec.shape, model)
        if key not in self._fns:
            self._fns[key] = self.latency.batch_latency(model, spec, self.workload)
        return self._fns[key]

    def alone(self, model: int, spec: GroupSpec) -> list[float]:
        key = (spec.shape, model)
        if key not in self._alone:
            self._alone[key] = alone_times(self.batch(model, spec),
                                           self.workload.model.tolist(), model)
        return self._alone[key]


def sim_group(group: ReplicaGroup, latency: LatencyModel, workload: Workload,
              name: str = "", started_at: float = 0.0, cold: bool = False,
              cache: LatencyCache | None = None) -> SimGroup:
    cache = cache or LatencyCache(latency, workload)
    ready = {m: started_at + (latency.cold_start_s(m, group.spec) if cold else 0.0)
             for m in group.models}
    return SimGroup(
        name=name,
        devices=group.spec.size,
        stages=group.spec.pp,
        latency={m: cache.batch(m, group.spec) for m in group.models},
        ready_at=ready,
        device_ids=tuple(d.device_id for d in group.spec.devices),
        started_at=started_at,
        alone={m: cache.alone(m, group.spec) for m in group.models},
    )


def simulate(placement: Placement, workload: Workload, latency: LatencyModel,
             deadline_s: np.ndarray, batching: BatchingConfig,
             cache: LatencyCache | None = None) -> SimResult:
    cache = cache or LatencyCache(latency, workload)
    engine = Engine(workload, deadline_s, batching)
    for i, group in enumerate(placement):
        if group.models:
            engine.add_group(sim_group(group, latency, workload, name=f"g{i}", cache=cache))
    return engine.run()


def summarize(result: SimResult) -> dict[str, float]:
    out = summarize_requests(result.workload.arrival_s, result.finish_s, result.deadline_s)
    out["devices"] = result.peak_devices
    out["device_seconds"] = result.device_seconds
    out["mean_batch_size"] = float(np.mean(result.batch_sizes)) if result.batch_sizes else 0.0
    return out
