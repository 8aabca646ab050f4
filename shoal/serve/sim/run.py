"""Run a static placement through the engine."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shoal.serve.hardware import Hardware
from shoal.serve.profiles import GroupSpec, LatencyModel
from shoal.serve.sim.engine import BatchingConfig, Engine, SimGroup, SimResult
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


def sim_group(group: ReplicaGroup, latency: LatencyModel, workload: Workload,
              name: str = "", started_at: float = 0.0, cold: bool = False) -> SimGroup:
    ready = {m: started_at + (latency.cold_start_s(m, group.spec) if cold else 0.0)
             for m in group.models}
    return SimGroup(
        name=name,
        devices=group.spec.size,
        stages=group.spec.pp,
        latency={m: latency.batch_latency(m, group.spec, workload) for m in group.models},
        ready_at=ready,
        device_ids=tuple(d.device_id for d in group.spec.devices),
        started_at=started_at,
    )


def simulate(placement: Placement, workload: Workload, latency: LatencyModel,
             deadline_s: np.ndarray, batching: BatchingConfig) -> SimResult:
    engine = Engine(workload, deadline_s, batching)
    for i, group in enumerate(placement):
        if group.models:
            engine.add_group(sim_group(group, latency, workload, name=f"g{i}"))
    return engine.run()


def summarize(result: SimResult) -> dict[str, float]:
    out = summarize_requests(result.workload.arrival_s, result.finish_s, result.deadline_s)
    out["devices"] = result.peak_devices
    out["device_seconds"] = result.device_seconds
    out["mean_batch_size"] = float(np.mean(result.batch_sizes)) if result.batch_sizes else 0.0
    return out
