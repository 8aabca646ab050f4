"""Model placement for serving: AlpaServe-style greedy over group partitions and parallel
configs, and the selective-replication baseline (one device per replica).

The greedy step follows AlpaServe (Li et al., OSDI 2023): simulate the current placement, take
the model with the most requests that miss their SLO, and add a replica of it to a device group
where it fits in memory and the simulated SLO attainment improves (groups tried least-loaded
first; if no group helps, the model with the next most misses is tried); stop when nothing fits
or attainment stops improving. Groups with the same shape and the same hosted models are
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
from shoal.serve.sim.run import LatencyCache, Placement, ReplicaGroup, simulate
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
    cache: LatencyCache | None = field(default=None, init=False)

    def score(self, placement: Placement) -> tuple[float, SimResult]:
        self.simulations += 1
        if self.cache is None:
            self.cache = LatencyCache(self.latency, self.workload)
        result = simulate(placement, self.workload, self.latency, self.deadline_s, self.batching,
                          self.cache)
        good = np.isfinite(result.finish_s) & (result.finish_s <= result.deadline_s + 1e-9)
        return float(good.mean()) if len(good) else 1.0, result


    def sampled(self, window_s: float, keep_every: int) -> PlacementProblem:
        """The same problem on every ``keep_every``-th window of the workload (for screening)."""
        workload, keep = self.workload.sample_windows(window_s, keep_every)
        slack = self.deadline_s[keep] - self.workload.arrival_s[keep]
        return PlacementProblem(self.cluster, workload, self.latency, workload.arrival_s + slack,
                                self.batching, self.num_models, self.target_attainment)


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
    """First improving group for ``model``, trying distinct group states least-loaded first
    (first-improvement keeps the search to about one simulation per added replica)."""
    seen: set[tuple] = set()
    order = sorted(range(len(groups)),
                   key=lambda i: (len(hosted[i]) / groups[i].size, -groups[i].size, i))
    for index in order:
        spec = groups[index]
        if model in hosted[index]:
            continue
        key = (spec.shape, tuple(sorted(hosted[index])))
        if key in seen or not _fits(problem, spec, [*hosted[index], model]):
            continue
        seen.add(key)
        trial = [ReplicaGroup(g, tuple(h) + ((model,) if i == index else ()))
                 for i, (g, h) in enumerate(zip(groups, hosted, strict=True))]
        attainment, result = problem.score(trial)
        if attainment > current + 1e-9:
            return index, attainment, result, model
    return None


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


def candidate_partitions(cluster: ServingCluster, sizes: Sequence[int]
                         ) -> list[tuple[int, int, int, list[GroupSpec]]]:
    """(size, pp, tp, groups) for every group size and split; with several device types every
    type is partitioned with the same group size and split."""
    by_type = cluster.by_type()
    out = []
    for size in sizes:
        if any(len(devs) < size for devs in by_type.values()):
            continue
        for pp, tp in parallel_configs(size):
            groups = list(itertools.chain.from_iterable(
                partition(devs, size, pp, tp) for devs in by_type.values()))
            out.append((size, pp, tp, groups))
    return out


def _better(a: PlacementChoice, b: PlacementChoice | None) -> bool:
    return b is None or (a.attainment, -a.devices) > (b.attainment, -b.devices)


def alpaserve_place(problem: PlacementProblem, sizes: Sequence[int] = (1, 2, 4, 8),
                    screen_keep_every: int = 1, finalists: int = 2,
                    screen_window_s: float = 30.0) -> PlacementChoice:
    """Best greedy placement over group sizes and (pp, tp) splits. Ties in attainment go to
    the placement using fewer devices.

    With ``screen_keep_every > 1`` every candidate partition is first searched on a window
    sample of the workload (1 window in ``screen_keep_every``) and only the ``finalists`` best
    are searched on the full workload; this cuts search time roughly by that factor.
    """
    candidates = candidate_partitions(problem.cluster, sizes)
    if not candidates:
        raise ValueError(f"no group size in {list(sizes)} fits the cluster")
    if screen_keep_every > 1 and len(candidates) > finalists:
        screen = problem.sampled(screen_window_s, screen_keep_every)
        scored = []
        for size, pp, tp, groups in candidates:
            placement, attainment = greedy_place(screen, groups)
            devices = sum(g.spec.size for g in placement)
            scored.append(((attainment, -devices), (size, pp, tp, groups)))
        problem.simulations += screen.simulations
        scored.sort(key=lambda item: item[0], reverse=True)
        candidates = [c for _, c in scored[:finalists]]
    best: PlacementChoice | None = None
    for size, pp, tp, groups in candidates:
        placement, attainment = greedy_place(problem, groups)
        choice = PlacementChoice(placement, attainment, size, pp, tp)
        if _better(choice, best):
            best = choice
    assert best is not None
    return best


def selective_replication(problem: PlacementProblem) -> PlacementChoice:
    """Baseline: every device is its own group; whole models are replicated onto devices."""
    return alpaserve_place(problem, sizes=(1,))
