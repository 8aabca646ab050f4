"""Pollux (OSDI'21): co-adaptive allocation maximizing a fair power mean of goodput speedups.

Objective (the paper's artifact): maximize the power mean with exponent p = -1 of

    scaled_j = speedup_j(nodes_j, replicas_j) * nodes / devices * restart_j

where ``speedup_j`` is job j's best goodput at that allocation over its goodput at a fair share
(ceil(devices / jobs) replicas on one node), and ``restart_j`` = max(age - restarts * delay, 0) /
(age + delay) when the allocation changes (1 when it is kept). Constraints: node capacity, at
most one distributed (multi-node) job per node, at most 16 nodes per job, and a job at most
doubles the largest replica count it has run at (so its model only extrapolates 2x).

The artifact searches with a genetic algorithm; here an exact-cost greedy does it. Maximizing
the p = -1 mean is minimizing sum_j 1 / (scaled_j + 1e-3). Phase 1 hands out devices by the
best cost decrease per device over every job and every larger replica count (lookahead jumps
capture the non-concavity that keeping an allocation avoids the restart penalty). Phase 2 keeps
unchanged jobs on their nodes and packs the rest, multi-node jobs first, shrinking a job that
no longer fits. Phase 3 hands out what is left, placement-aware.

Jobs that declare their model (:mod:`shoal.perf.planned`) have goodput 0 wherever no parallel
plan fits, so phase 1 never picks such a device count; phases 2 and 3 also skip placements
whose device type or spread over nodes no plan fits, and a job's speedup base is its smallest
fitting size when it fits on no fair share.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from shoal.core.types import ClusterState, Decision, Grant, JobView
from shoal.perf.goodput import SpeedupFunction
from shoal.perf.planned import PlacementCheck, placement_check

_EPS = 1e-3


@dataclass
class _Job:
    view: JobView
    max_replicas: int
    speedup: SpeedupFunction | None
    fair_replicas: int
    factor: float
    current: dict[int, int]
    # Jobs that declare a model: whether a plan fits a spread of devices of a type.
    fits: PlacementCheck | None = None

    def allows(self, device_type: str, per_node: Iterable[int]) -> bool:
        return self.fits is None or self.fits(device_type, per_node)

    def raw_speedup(self, nodes: np.ndarray, replicas: np.ndarray) -> np.ndarray:
        if self.speedup is None:
            return replicas / self.fair_replicas
        return np.asarray(self.speedup(nodes, replicas), dtype=float)


class PolluxPolicy:
    name = "pollux"
    adapts_batch_size = True
    decides_on_arrival = False
    decides_on_completion = False

    def __init__(self, restart_delay: float = 30.0, max_nodes_per_job: int = 16):
        self.restart_delay = restart_delay
        self.max_nodes_per_job = max_nodes_per_job

    # ----- model -----
    def _jobs(self, views: Sequence[JobView], cluster: ClusterState, dtype: str) -> list[_Job]:
        # Pollux is heterogeneity-unaware: on a mixed cluster every device counts the same and
        # a job uses the model of the first type it knows (preferring ``dtype``).
        capacity = cluster.capacity()
        fair = math.ceil(capacity / max(len(views), 1))
        per_node = max(n.capacity for n in cluster.nodes)
        out = []
        for view in views:
            profiled = max(view.hints.max_profiled_replicas.values(), default=0)
            cap = min(max(2 * profiled, 1), capacity, view.limits.max_replicas)
            if view.spec.max_replicas is not None:
                cap = min(cap, view.spec.max_replicas)
            model = view.hints.goodput.get(dtype) or next(iter(view.hints.goodput.values()), None)
            speedup = None
            if model is not None:
                base = float(model.optimize(1, fair).goodput)
                if base <= 0:
                    base = float(model.optimize(1, 1).goodput)
                if base <= 0:  # a large model that fits only on several devices
                    r = np.arange(1, cap + 1)
                    goodput = np.asarray(model.optimize(-(-r // per_node), r).goodput)
                    base = float(goodput[goodput > 0][0]) if (goodput > 0).any() else 1.0
                speedup = SpeedupFunction(model, base)
            age = view.age
            factor = max(age - view.num_restarts * self.restart_delay, 0.0) / (
                age + self.restart_delay
            )
            current = view.allocation.per_node() if view.allocation else {}
            out.append(_Job(view, cap, speedup, fair, factor, current,
                            placement_check(view.hints.goodput)))
        return out

    def decide(self, jobs: Sequence[JobView], cluster: ClusterState, now: float) -> Decision:
        if not jobs:
            return {}
        dtype = cluster.device_types[0]
        nodes = list(cluster.nodes)
        self._type_of = {n.node_id: n.device_type for n in nodes}
        per_node = max(n.capacity for n in nodes)
        scale = len(nodes) / cluster.capacity()
        state = self._jobs(jobs, cluster, dtype)
        counts = self._choose_counts(state, cluster.capacity(), len(nodes), per_node, scale)
        placed = self._place(state, counts, nodes, per_node)
        placed = self._fill(state, placed, nodes, scale)
        decision: Decision = {}
        for job in state:
            alloc = placed.get(job.view.name)
            if not alloc:
                continue
            node_ids = tuple(n for n in sorted(alloc) for _ in range(alloc[n]))
            decision[job.view.name] = Grant(len(node_ids), self._type_of[node_ids[0]], node_ids)
        return decision

    def objective(self, decision: Decision, jobs: Sequence[JobView],
                  cluster: ClusterState) -> float:
        """The power mean (p = -1) this policy maximizes, for any decision."""
        dtype = cluster.device_types[0]
        scale = len(cluster.nodes) / cluster.capacity()
        total = 0.0
        for job in self._jobs(jobs, cluster, dtype):
            grant = decision.get(job.view.name)
            alloc: dict[int, int] = {}
            for n in grant.nodes if grant and grant.nodes else ():
                alloc[n] = alloc.get(n, 0) + 1
            value = 0.0
            if alloc:
                r = sum(alloc.values())
                value = float(job.raw_speedup(np.array([len(alloc)]), np.array([r]))[0]) * scale
                if alloc != job.current:
                    value *= job.factor
            total += 1.0 / (value + _EPS)
        return len(jobs) / total

    # ----- phase 1: device counts -----
    def _cost_table(self, state: list[_Job], width: int, per_node: int, scale: float):
        table = np.full((len(state), width + 1), np.inf)
        for j, job in enumerate(state):
            r = np.arange(1, job.max_replicas + 1)
            n = -(-r // per_node)
            value = job.raw_speedup(n, r) * scale * job.factor
            table[j, 0] = 1.0 / _EPS
            table[j, 1 : job.max_replicas + 1] = 1.0 / (value + _EPS)
            kept = sum(job.current.values())
            if 0 < kept <= width:
                n_kept = np.array([len(job.current)])
                v_kept = float(job.raw_speedup(n_kept, np.array([kept]))[0]) * scale
                table[j, kept] = min(table[j, kept], 1.0 / (v_kept + _EPS))
        return table

    def _choose_counts(self, state, capacity, num_nodes, per_node, scale) -> np.ndarray:
        width = max(j.max_replicas for j in state)
        width = max(width, max(sum(j.current.values()) for j in state))
        table = self._cost_table(state, width, per_node, scale)
        counts = np.zeros(len(state), dtype=int)
        cols = np.arange(width + 1)
        need = -(-cols // per_node)
        free = capacity
        dist_nodes = 0

        def row_best(j: int) -> tuple[float, int]:
            have = counts[j]
            own = need[have] if have > per_node else 0
            ok = (cols > have) & (cols - have <= free) & np.isfinite(table[j])
            ok &= (cols <= per_node) | (dist_nodes - own + need <= num_nodes)
            if not ok.any():
                return -np.inf, have
            ratio = np.where(ok, (table[j, have] - table[j]) / np.maximum(cols - have, 1), -np.inf)
            r = int(np.argmax(ratio))
            return float(ratio[r]), r

        # Cached bests only lose candidates as devices run out, so a cached best that is still
        # feasible is exact; an infeasible one is recomputed before it can be chosen. A heap of
        # (best ratio, job) with lazy invalidation finds the next move in O(log jobs).
        heap = []
        for j in range(len(state)):
            ratio, r = row_best(j)
            heap.append((-ratio, j, r))
        heapq.heapify(heap)
        while free > 0 and heap:
            neg_ratio, j, r = heapq.heappop(heap)
            if not -neg_ratio > 0:
                break
            have = counts[j]
            if r <= have:
                continue
            own = need[have] if have > per_node else 0
            feasible = r - have <= free and (
                r <= per_node or dist_nodes - own + need[r] <= num_nodes
            )
            if feasible:
                free -= r - have
                dist_nodes += (need[r] if r > per_node else 0) - own
                counts[j] = r
            ratio, r = row_best(j)
            if ratio > 0:
                heapq.heappush(heap, (-ratio, j, r))
        return counts

    # ----- phase 2: nodes -----
    def _place(self, state, counts, nodes, per_node) -> dict[str, dict[int, int]]:
        free = {n.node_id: n.capacity for n in nodes}
        owner: dict[int, str] = {}
        placed: dict[str, dict[int, int]] = {}
        pending = []
        for job, count in zip(state, counts, strict=True):
            name = job.view.name
            if count > 0 and count == sum(job.current.values()) and all(
                n in free for n in job.current
            ):
                placed[name] = dict(job.current)
                for n, c in job.current.items():
                    free[n] -= c
                    if len(job.current) > 1:
                        owner[n] = name
            elif count > 0:
                pending.append((job, int(count)))
        pending.sort(key=lambda item: -item[1])
        for job, count in pending:
            name = job.view.name
            while count > 0:
                alloc = self._fit(job, free, owner, count, per_node)
                if alloc is not None:
                    placed[name] = alloc
                    for n, c in alloc.items():
                        free[n] -= c
                        if len(alloc) > 1:
                            owner[n] = name
                    break
                count -= 1
        self._free, self._owner = free, owner
        return placed

    def _fit(self, job, free, owner, count, per_node) -> dict[int, int] | None:
        if count <= per_node:
            fits = [n for n, f in free.items()
                    if f >= count and job.allows(self._type_of[n], (count,))]
            if fits:
                best = min(fits, key=lambda n: (free[n], n))
                return {best: count}
        # A distributed job spans nodes of one device type only.
        for dtype in dict.fromkeys(self._type_of.values()):
            spread = sorted((n for n, f in free.items()
                             if f > 0 and n not in owner and self._type_of[n] == dtype),
                            key=lambda n: (-free[n], n))
            alloc: dict[int, int] = {}
            left = count
            for n in spread[: self.max_nodes_per_job]:
                take = min(free[n], left)
                alloc[n] = take
                left -= take
                if left == 0:
                    break
            if left == 0 and job.allows(dtype, alloc.values()):
                return alloc
        return None

    # ----- phase 3: leftovers -----
    def _fill(self, state, placed, nodes, scale) -> dict[str, dict[int, int]]:
        free, owner = self._free, self._owner

        def value(job: _Job, alloc: dict[int, int]) -> float:
            if not alloc:
                return 0.0
            r = sum(alloc.values())
            v = float(job.raw_speedup(np.array([len(alloc)]), np.array([r]))[0]) * scale
            return v if alloc == job.current else v * job.factor

        while sum(free.values()) > 0:
            best = None
            for job in state:
                name = job.view.name
                alloc = placed.get(name, {})
                have = sum(alloc.values())
                if have >= job.max_replicas:
                    continue
                old_cost = 1.0 / (value(job, alloc) + _EPS)
                for n in free:
                    if free[n] <= 0:
                        continue
                    grown = dict(alloc)
                    grown[n] = grown.get(n, 0) + 1
                    if len(grown) > 1 and (
                        len(grown) > self.max_nodes_per_job
                        or any(owner.get(m, name) != name for m in grown)
                        or len({self._type_of[m] for m in grown}) > 1
                    ):
                        continue
                    if not job.allows(self._type_of[n], grown.values()):
                        continue
                    gain = old_cost - 1.0 / (value(job, grown) + _EPS)
                    if gain > 0 and (best is None or gain > best[0]):
                        best = (gain, name, n, grown)
            if best is None:
                break
            _, name, n, grown = best
            placed[name] = grown
            free[n] -= 1
            if len(grown) > 1:
                for m in grown:
                    owner[m] = name
        return placed
