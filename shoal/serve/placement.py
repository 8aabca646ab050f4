"""Model placement for serving: AlpaServe-style greedy over group partitions and parallel
configs, and the selective-replication baseline (one device per replica).

The greedy step follows AlpaServe (Li et al., OSDI 2023): simulate the current placement, take
the model with the most requests that miss their SLO, and add a replica of it to a device group
where it fits in memory and the simulated SLO attainment improves (groups tried least-loaded
first; if no group helps, the model with the next most misses is tried); stop when nothing fits
or attainment stops improving. Groups with the same shape and the same hosted models are
interchangeable, so only one of each is tried.

shoal's placement adds a refinement to that greedy (``refine``): where AlpaServe stops because
no single added replica raises attainment, shoal also tries replacing a hosted replica by one
of a model that misses requests, and dropping a replica that adds contention, and resumes
adding after any move that helps. The selective-replication baseline is the plain greedy.
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
                 max_steps: int = 1000, refine: bool = False,
                 refine_budget: int = 600) -> tuple[Placement, float]:
    """Greedy replica addition on fixed ``groups``; returns the placement and its attainment.

    With ``refine``, when no addition improves attainment the search does not stop: it tries
    replacing a replica in a group by one of a model that misses requests, then dropping a
    replica of a model that has others (less contention for the group), taking the first
    move that improves simulated attainment and resuming additions after it. At most
    ``refine_budget`` simulations are spent on such moves.
    """
    hosted: list[list[int]] = [[] for _ in groups]
    attainment, result = problem.score([])
    budget = [refine_budget]
    for _ in range(max_steps):
        if attainment >= problem.target_attainment:
            break
        misses = _misses_by_model(problem, result)
        targets = [int(m) for m in np.argsort(-misses, kind="stable")[:4] if misses[m] > 0]
        step = None
        for model in targets:
            step = _best_group_for(problem, groups, hosted, model, attainment)
            if step is not None:
                break
        if step is None and refine:
            step = _replace_step(problem, groups, hosted, targets, attainment, budget)
            if step is None:
                step = _drop_step(problem, groups, hosted, attainment, budget)
        if step is None:
            break
        index, attainment, result, models = step
        hosted[index] = list(models)
    placement = [ReplicaGroup(g, tuple(h)) for g, h in zip(groups, hosted, strict=True) if h]
    return placement, attainment


def _trial(groups: Sequence[GroupSpec], hosted: list[list[int]], index: int,
           models: Sequence[int]) -> Placement:
    return [ReplicaGroup(g, tuple(models) if i == index else tuple(h))
            for i, (g, h) in enumerate(zip(groups, hosted, strict=True))]


def _by_load(groups: Sequence[GroupSpec], hosted: list[list[int]]) -> list[int]:
    return sorted(range(len(groups)),
                  key=lambda i: (len(hosted[i]) / groups[i].size, -groups[i].size, i))


def _best_group_for(problem, groups, hosted, model, current):
    """First improving group for ``model``, trying distinct group states least-loaded first
    (first-improvement keeps the search to about one simulation per added replica)."""
    seen: set[tuple] = set()
    for index in _by_load(groups, hosted):
        spec = groups[index]
        if model in hosted[index]:
            continue
        key = (spec.shape, tuple(sorted(hosted[index])))
        if key in seen or not _fits(problem, spec, [*hosted[index], model]):
            continue
        seen.add(key)
        models = [*hosted[index], model]
        attainment, result = problem.score(_trial(groups, hosted, index, models))
        if attainment > current + 1e-9:
            return index, attainment, result, models
    return None


def _replicas(hosted: list[list[int]]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for models in hosted:
        for m in models:
            counts[m] = counts.get(m, 0) + 1
    return counts


def _replace_step(problem, groups, hosted, targets, current, budget):
    """First improving swap of a hosted replica (of a model with other replicas) for a replica
    of a model in ``targets`` (most misses first), distinct group states tried once."""
    counts = _replicas(hosted)
    for model in targets:
        seen: set[tuple] = set()
        for index in _by_load(groups, hosted):
            spec = groups[index]
            if model in hosted[index] or not hosted[index]:
                continue
            key = (spec.shape, tuple(sorted(hosted[index])))
            if key in seen:
                continue
            seen.add(key)
            for old in hosted[index]:
                if counts[old] < 2 or old in targets[:targets.index(model)]:
                    continue
                models = [model if m == old else m for m in hosted[index]]
                if not _fits(problem, spec, models):
                    continue
                if budget[0] <= 0:
                    return None
                budget[0] -= 1
                attainment, result = problem.score(_trial(groups, hosted, index, models))
                if attainment > current + 1e-9:
                    return index, attainment, result, models
    return None


def _drop_step(problem, groups, hosted, current, budget):
    """First improving removal of a replica of a model that keeps at least one other."""
    counts = _replicas(hosted)
    seen: set[tuple] = set()
    for index in reversed(_by_load(groups, hosted)):  # most loaded groups first
        spec = groups[index]
        key = (spec.shape, tuple(sorted(hosted[index])))
        if key in seen:
            continue
        seen.add(key)
        for old in hosted[index]:
            if counts[old] < 2:
                continue
            if budget[0] <= 0:
                return None
            budget[0] -= 1
            models = [m for m in hosted[index] if m != old]
            attainment, result = problem.score(_trial(groups, hosted, index, models))
            if attainment > current + 1e-9:
                return index, attainment, result, models
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
                    screen_window_s: float = 30.0, refine: bool = True) -> PlacementChoice:
    """Best greedy placement over group sizes and (pp, tp) splits. Ties in attainment go to
    the placement using fewer devices.

    With ``screen_keep_every > 1`` every candidate partition is first searched on a window
    sample of the workload (1 window in ``screen_keep_every``) and only the ``finalists`` best
    are searched on the full workload; this cuts search time roughly by that factor.
    ``refine`` adds the replace / drop moves of :func:`greedy_place` to the full-workload
    search of the finalists (screening stays additions only).
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
        placement, attainment = greedy_place(problem, groups, refine=refine)
        choice = PlacementChoice(placement, attainment, size, pp, tp)
        if _better(choice, best):
            best = choice
    assert best is not None
    return best


def selective_replication(problem: PlacementProblem, refine: bool = False) -> PlacementChoice:
    """Baseline: every device is its own group; whole models are replicated onto devices."""
    return alpaserve_place(problem, sizes=(1,), refine=refine)
