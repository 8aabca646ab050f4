"""Build a serving problem from user-level options and run the named placement policies."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from shoal.serve.hardware import ServingCluster, parse_devices
from shoal.serve.placement import (
    PlacementChoice,
    PlacementProblem,
    alpaserve_place,
    selective_replication,
)
from shoal.serve.profiles import ZOO, LLMLatencyModel, model_mix
from shoal.serve.replacement import periodic_replacement
from shoal.serve.sim.engine import BatchingConfig
from shoal.serve.sim.run import deadlines, simulate, summarize
from shoal.serve.sim.workload import trace_workload
from shoal.spec.errors import SpecError

POLICIES = ("shoal", "selective-replication", "periodic")


@dataclass(frozen=True)
class ServeSimConfig:
    trace: str = "code"
    models: int = 8
    devices: str = "v100:16"
    slo_scale: float = 5.0
    cv: float | None = None
    rate_scale: float = 1.0
    mix: tuple[str, ...] = ("opt-6.7b",)
    popularity_skew: float = 1.0
    max_batch: int = 4
    max_wait_s: float = 0.0
    seed: int = 0
    period_s: float = 60.0
    screen_keep_every: int = 4
    duration_s: float | None = None  # keep only the first seconds of the (scaled) trace

    def validate(self) -> None:
        if self.models < 1:
            raise SpecError("must be >= 1", field="models")
        if self.slo_scale <= 0:
            raise SpecError("must be > 0 (deadline = scale x latency alone)", field="slo_scale")
        if self.cv is not None and self.cv <= 0:
            raise SpecError("must be > 0 (1 = Poisson); omit it to keep the trace's times",
                            field="cv")
        unknown = [m for m in self.mix if m not in ZOO]
        if unknown:
            raise SpecError(f"unknown models {unknown}; known: {sorted(ZOO)}", field="mix")
        if self.max_batch < 1:
            raise SpecError("must be >= 1", field="max_batch")


def build_problem(config: ServeSimConfig,
                  cluster: ServingCluster | None = None) -> PlacementProblem:
    config.validate()
    cluster = cluster or parse_devices(config.devices)
    rng = np.random.default_rng(config.seed)
    workload = trace_workload(config.trace, config.models, rng, rate_scale=config.rate_scale,
                              popularity_skew=config.popularity_skew, cv=config.cv)
    if config.duration_s is not None:
        workload = workload.window(0.0, config.duration_s)
    latency = LLMLatencyModel(tuple(model_mix(config.models, config.mix)))
    deadline = deadlines(workload, latency, config.slo_scale, cluster.most_common_type())
    batching = BatchingConfig(max_batch=config.max_batch, max_wait_s=config.max_wait_s)
    return PlacementProblem(cluster, workload, latency, deadline, batching, config.models)


def _describe(choice: PlacementChoice) -> list[dict]:
    return [{"devices": [d.device_id for d in g.spec.devices], "device_type": g.spec.hardware.name,
             "pp": g.spec.pp, "tp": g.spec.tp, "models": list(g.models)}
            for g in choice.placement]


def run_policy(name: str, problem: PlacementProblem, config: ServeSimConfig) -> dict:
    """Place with policy ``name``, simulate, and return summary + placement + search cost."""
    started = time.perf_counter()
    if name == "shoal":
        choice = alpaserve_place(problem, screen_keep_every=config.screen_keep_every)
    elif name == "selective-replication":
        choice = selective_replication(problem)
    elif name == "periodic":
        result = periodic_replacement(problem, period_s=config.period_s)
        summary = summarize(result)
        return {"summary": summary, "placement": None,
                "search_seconds": time.perf_counter() - started}
    else:
        raise SpecError(f"unknown policy '{name}'; choose from {', '.join(POLICIES)}",
                        field="policy")
    search_s = time.perf_counter() - started
    result = simulate(choice.placement, problem.workload, problem.latency, problem.deadline_s,
                      problem.batching, problem.cache)
    summary = summarize(result)
    return {"summary": summary, "placement": _describe(choice),
            "parallel": {"group_size": choice.group_size, "pp": choice.pp, "tp": choice.tp},
            "search_seconds": search_s, "simulations": problem.simulations,
            "latency_s": (result.finish_s - result.workload.arrival_s)[
                np.isfinite(result.finish_s)].tolist()}
