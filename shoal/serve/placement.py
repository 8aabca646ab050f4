"""Model placement for serving: AlpaServe-style greedy over group partitions and parallel
configs, and the selective-replication baseline (one device per replica).

The greedy step follows AlpaServe (Li et al., OSDI 2023): simulate the current placement, take
the model with the most requests that miss their SLO, and add a replica of it to the device group
(of those where it fits in memory) whose simulated SLO attainment is highest; stop when nothing
fits or attainment stops improving. Groups with the same shape and the same hosted models are
interchangeable, so only one of each is tried.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from shoal.serve.hardware import Device, ServingCluster
from shoal.serve.profiles import GroupSpec, LatencyModel
from shoal.serve.sim.engine import BatchingConfig, SimResult
from shoal.serve.sim.run import Placement, ReplicaGroup, simulate
from shoal.serve.sim.workload import Workload


@dataclass
class PlacementProblem:
    cluster: ServingCluster
    workload: Workload
    latency: LatencyModel
    deadline_s: np.ndarray
    batching: BatchingConfig
    num_models: int
    target_attainment: float = 0.999
    simulations: int = field(default=0, init=False)

    def score(self, placement: Placement) -> tuple[float, SimResult]:
        self.simulations += 1
        result = simulate(placement, self.workload, self.latency, self.deadline_s, self.batching)
        good = np.isfinite(result.finish_s) & (result.finish_s <= result.deadline_s + 1e-9)
        return float(good.mean()) if len(good) else 1.0, result


def parallel_configs(size: int) -> list[tuple[int, int]]:
    """All (pp, tp) with pp * tp = size."""
    return [(pp, size // pp) for pp in range(1, size + 1) if size % pp == 0]


def partition(devices: Sequence[Device], size: int, pp: int, tp: int) -> list[GroupSpec]:
    """Consecutive groups of ``size`` devices (nodes are numbered consecutively, so groups no
    larger than a node stay inside one when node sizes are multiples of ``size``)."""
    groups = [GroupSpec(tuple(devices[i:i + size]), pp, tp)
              for i in range(0, len(devices) - size + 1, size)]
    return groups


def _fits(problem: PlacementProblem, spec: GroupSpec, models: Iterable[int]) -> bool:
    capacity = problem.latency.device_capacity(spec.hardware)  # type: ignore[attr-defined]
    used = sum(problem.latency.memory_per_device(m, spec) for m in models)
    return used <= capacity


def _misses_by_model(problem: PlacementProblem, result: SimResult) -> np.ndarray:
    missed = ~(np.isfinite(result.finish_s) & (result.finish_s <= result.deadline_s + 1e-9))
    return np.bincount(problem.workload.model[missed], minlength=problem.num_models)


def greedy_place(problem: PlacementProblem, groups: Sequence[GroupSpec],
                 max_steps: int = 1000) -> tuple[Placement, float]:
    """Greedy replica addition on fixed ``groups``; returns the placement and its attainment."""
    hosted: list[list[int]] = [[] for _ in groups]
    attainment, result = problem.score([])
    for _ in range(max_steps):
        if attainment >= problem.target_attainment:
            break
        misses = _misses_by_model(problem, result)
        step = None
        for model in np.argsort(-misses, kind="stable")[:4]:
            if misses[model] == 0:
                break
            step = _best_group_for(problem, groups, hosted, int(model), attainment)
            if step is not None:
                break
        if step is None:
            break
        index, attainment, result, added = step
        hosted[index].append(added)
    placement = [ReplicaGroup(g, tuple(h)) for g, h in zip(groups, hosted, strict=True) if h]
    return placement, attainment


def _best_group_for(problem, groups, hosted, model, current):
    seen: set[tuple] = set()
    best = None
    for index, spec in enumerate(groups):
        if model in hosted[index]:
            continue
        key = (spec.shape, tuple(sorted(hosted[index])))
        if key in seen or not _fits(problem, spec, [*hosted[index], model]):
            continue
        seen.add(key)
        trial = [ReplicaGroup(g, tuple(h) + ((model,) if i == index else ()))
                 for i, (g, h) in enumerate(zip(groups, hosted, strict=True))]
        attainment, result = problem.score(trial)
        if attainment > current + 1e-9 and (best is None or attainment > best[1]):
            best = (index, attainment, result, model)
    return best


@dataclass(frozen=True)
class PlacementChoice:
    placement: Placement
    attainment: float
    group_size: int
    pp: int
    tp: int

    @property
    def devices(self) -> int:
        return sum(g.spec.size for g in self.placement)


def alpaserve_place(problem: PlacementProblem, sizes: Sequence[int] = (1, 2, 4, 8),
                    configs: str = "all") -> PlacementChoice:
    """Best greedy placement over uniform group sizes and (pp, tp) splits per device type.

    With several device types every type is partitioned with the same group size and split.
    Ties in attainment go to the placement using fewer devices.
    """
    by_type = problem.cluster.by_type()
    best: PlacementChoice | None = None
    for size in sizes:
        if any(len(devs) < size for devs in by_type.values()):
            continue
        splits = parallel_configs(size) if configs == "all" else [(size, 1)]
        for pp, tp in splits:
            groups = list(itertools.chain.from_iterable(
                partition(devs, size, pp, tp) for devs in by_type.values()))
            placement, attainment = greedy_place(problem, groups)
            choice = PlacementChoice(placement, attainment, size, pp, tp)
            if best is None or (attainment, -choice.devices) > (best.attainment, -best.devices):
                best = choice
    if best is None:
        raise ValueError(f"no group size in {list(sizes)} fits the cluster")
    return best


def selective_replication(problem: PlacementProblem) -> PlacementChoice:
    """Baseline: every device is its own group; whole models are replicated onto devices."""
    return alpaserve_place(problem, sizes=(1,))
