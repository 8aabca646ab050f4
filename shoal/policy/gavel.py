"""Gavel (OSDI'20): heterogeneity-aware max-min fairness, time-shared in rounds.

Every job runs at its user's scale ``s_m`` (device count) and batch size; what Gavel decides is
*how often* and *on which device type*. The allocation is the LP of the artifact's
``MaxMinFairnessPolicyWithPerf``: ``X[m, j]`` is the fraction of time job ``m`` runs on type ``j``,

    maximize    t
    subject to  t <= (s_m / w_m) * sum_j T[m, j] X[m, j] / T_eq[m]     for every job m
                sum_j X[m, j] <= 1                                     for every job m
                sum_m s_m X[m, j] <= N_j                               for every type j
                X >= 0,  X[m, j] = 0 where T[m, j] = 0

with ``T[m, j]`` the job's throughput (samples/s) at its scale on type ``j``, ``w_m`` its weight,
``N_j`` the devices of type ``j`` and ``T_eq[m] = sum_j T[m, j] N_j / N`` its throughput on an
equal, capacity-proportional share of every type (Gavel's proportional split; the artifact
normalizes by the heterogeneity-agnostic max-min allocation, whose split across types is not
unique). Multiplying by ``s_m`` makes equal normalized throughput mean equal device-time. The LP
is solved exactly with HiGHS (scipy.optimize.linprog).

Rounds (Gavel's mechanism): every ``round_duration`` seconds the policy picks what runs next.
For each type, fastest type first, jobs are ordered by priority ``X[m, j] / f[m, j]`` (``f``:
fraction of the type's time the job received since the last reset; ties by accumulated
deficit, then by allocation), and each job not yet placed this round is started when its
``s_m`` devices of that type are free. Time counters reset, as in Gavel, whenever the set of
jobs changes (starting every job at half a round, the artifact's prior); the deficit of each job
(time owed minus time received) carries over resets. Within a round, devices freed by a
finishing job go to the next jobs in the same order (work conservation; Gavel would wait for
the round's end).

Throughputs come from each job's fitted model for a type when it has one, else from the
simulator's oracle (``throughput(device_type, replicas, batch)``) when offered, else a type the
job has no information about is taken as fast as the mean of the types it does (all equal
when it knows nothing). A job larger than every single type's capacity runs at the largest
capacity it may use (unless rigid).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix, vstack

from shoal.core.types import ClusterState, Decision, Grant, JobView
from shoal.policy.fixed_size import allowed_types, requested_size


@dataclass(frozen=True)
class GavelAllocation:
    """The LP's answer: time fractions ``x[m, j]`` and the optimal max-min value ``t``."""

    jobs: tuple[str, ...]
    types: tuple[str, ...]
    x: np.ndarray
    value: float


def max_min_allocation(
    throughput: np.ndarray, scale: np.ndarray, weight: np.ndarray, capacity: np.ndarray
) -> tuple[np.ndarray, float]:
    """Solve Gavel's heterogeneity-aware max-min fairness LP (see the module docstring).

    ``throughput`` is (jobs x types); ``scale``, ``weight`` per job; ``capacity`` per type.
    Jobs whose throughput is zero on every type get no time. Returns (x, t).
    """
    throughput = np.asarray(throughput, dtype=float)
    m, n = throughput.shape
    if m == 0:
        return np.zeros((0, n)), 0.0
    capacity = np.asarray(capacity, dtype=float)
    scale = np.asarray(scale, dtype=float)
    weight = np.asarray(weight, dtype=float)
    equal = throughput @ (capacity / capacity.sum())
    runnable = equal > 0
    if not runnable.any():
        return np.zeros((m, n)), 0.0
    coeff = np.zeros_like(throughput)
    coeff[runnable] = (
        throughput[runnable] * (scale[runnable] / (weight[runnable] * equal[runnable]))[:, None]
    )
    # Variables: x[m, j] row-major, then t. linprog minimizes, so the objective is -t.
    num = m * n
    job_of = np.repeat(np.arange(m), n)
    type_of = np.tile(np.arange(n), m)
    cols = np.arange(num)
    live = np.flatnonzero(runnable)
    rows_fair = np.concatenate([job_of[np.isin(job_of, live)], live])
    cols_fair = np.concatenate([cols[np.isin(job_of, live)], np.full(len(live), num)])
    vals_fair = np.concatenate([-coeff.ravel()[np.isin(job_of, live)], np.ones(len(live))])
    fair = coo_matrix((vals_fair, (rows_fair, cols_fair)), shape=(m, num + 1))
    time = coo_matrix((np.ones(num), (job_of, cols)), shape=(m, num + 1))
    devices = coo_matrix((scale[job_of], (type_of, cols)), shape=(n, num + 1))
    a_ub = vstack([fair, time, devices]).tocsr()
    b_ub = np.concatenate([np.zeros(m), np.ones(m), capacity])
    upper = np.where(throughput.ravel() > 0, 1.0, 0.0)
    bounds = np.column_stack([np.zeros(num + 1), np.append(upper, np.inf)])
    c = np.zeros(num + 1)
    c[-1] = -1.0
    result = linprog(c, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
    if result.status != 0:
        raise RuntimeError(f"Gavel LP not solved: {result.message}")
    x = np.clip(result.x[:num].reshape(m, n), 0.0, 1.0) + 0.0  # + 0.0 drops -0.0
    return x, float(result.x[-1])


class GavelPolicy:
    name = "gavel"
    adapts_batch_size = False
    decides_on_arrival = False
    decides_on_completion = False

    def __init__(self, round_duration: float = 360.0):
        self.round_duration = round_duration
        self._allocation: GavelAllocation | None = None
        self._job_set: frozenset[str] = frozenset()
        self._time: dict[str, dict[str, float]] = {}  # job -> type -> seconds since reset
        self._deficit: dict[str, dict[str, float]] = {}
        self._last_now: float | None = None
        self._last_reset = 0.0
        self._round_end = -math.inf
        self._scheduled: dict[str, str] = {}  # job -> type, this round
        self._throughput = np.zeros((0, 0))  # rows of the last solved allocation

    # ----- inputs -----
    @staticmethod
    def _scale(job: JobView, cluster: ClusterState) -> int:
        return requested_size(job, cluster)

    @staticmethod
    def _batch(job: JobView) -> int:
        return job.spec.batch_size or job.limits.init_batch_size

    def _throughputs(self, job: JobView, scale: int, cluster: ClusterState,
                     types: Sequence[str]) -> np.ndarray:
        batch = self._batch(job)
        known: dict[str, float] = {}
        oracle_throughput = getattr(job.oracle, "throughput", None)
        for dtype in types:
            model = job.hints.goodput.get(dtype)
            if model is not None:
                per_node = cluster.largest_node(dtype)
                nodes = math.ceil(scale / per_node)
                local = math.ceil(batch / scale)
                accum = max(math.ceil(local / job.limits.max_local_bsz) - 1, 0)
                atomic = math.ceil(local / (accum + 1))
                known[dtype] = float(model.throughput(nodes, scale, atomic, accum))
            elif oracle_throughput is not None:
                known[dtype] = float(oracle_throughput(dtype, scale, batch))
        fill = float(np.mean(list(known.values()))) if known else 1.0
        allowed = set(allowed_types(job, types))
        return np.array([
            known.get(t, fill) if t in allowed and cluster.capacity(t) >= scale else 0.0
            for t in types
        ])

    # ----- bookkeeping -----
    def _account(self, jobs: Sequence[JobView], now: float) -> None:
        elapsed = 0.0 if self._last_now is None else now - self._last_now
        self._last_now = now
        for job in jobs:
            if job.allocation is not None and elapsed > 0:
                per_type = self._time.setdefault(job.name, {})
                dtype = job.allocation.device_type
                per_type[dtype] = per_type.get(dtype, self.round_duration / 2) + elapsed

    def _reset(self, names: frozenset[str], types: Sequence[str], now: float) -> None:
        """Gavel's reset on every arrival or completion: settle deficits, restart counters."""
        since = now - self._last_reset
        prior = self.round_duration / 2
        alloc = self._allocation
        for name in names & self._job_set:
            for dtype in types:
                x = 0.0
                if alloc is not None and name in alloc.jobs and dtype in alloc.types:
                    x = float(alloc.x[alloc.jobs.index(name), alloc.types.index(dtype)])
                received = self._time.get(name, {}).get(dtype, prior) - prior
                owed = self._deficit.setdefault(name, {})
                owed[dtype] = owed.get(dtype, 0.0) + x * since - received
        self._time = {name: dict.fromkeys(types, prior) for name in names}
        self._deficit = {name: self._deficit.get(name, {}) for name in names}
        self._last_reset = now

    def solve(self, jobs: Sequence[JobView], cluster: ClusterState) -> GavelAllocation:
        types = tuple(cluster.device_types)
        scales = np.array([self._scale(j, cluster) for j in jobs], dtype=float)
        throughput = np.array(
            [self._throughputs(j, int(s), cluster, types) for j, s in zip(jobs, scales,
                                                                          strict=True)]
        ).reshape(len(jobs), len(types))
        weights = np.array([j.spec.weight for j in jobs], dtype=float)
        capacity = np.array([cluster.capacity(t) for t in types], dtype=float)
        x, value = max_min_allocation(throughput, scales, weights, capacity)
        self._throughput = throughput
        return GavelAllocation(tuple(j.name for j in jobs), types, x, value)

    # ----- the round -----
    def decide(self, jobs: Sequence[JobView], cluster: ClusterState, now: float) -> Decision:
        self._account(jobs, now)
        names = frozenset(j.name for j in jobs)
        types = cluster.device_types
        changed = names != self._job_set
        new_round = now >= self._round_end
        if changed:
            self._reset(names, types, now)
        if changed or new_round or self._allocation is None:
            self._allocation = self.solve(jobs, cluster)
            self._job_set = names
        if new_round:
            self._round_end = now + self.round_duration
            self._scheduled = {}
        return self._schedule(jobs, cluster)

    def _order(self, alloc: GavelAllocation) -> list[tuple[int, int]]:
        """(job index, type index) pairs: per type, fastest type first, by Gavel's priority."""
        x = alloc.x
        throughput = self._throughput
        equal = throughput @ np.ones(len(alloc.types))
        relative = np.divide(throughput, equal[:, None], out=np.zeros_like(throughput),
                             where=equal[:, None] > 0)
        type_order = sorted(range(len(alloc.types)),
                            key=lambda j: (-float(relative[:, j].mean()), alloc.types[j]))
        out: list[tuple[int, int]] = []
        for j in type_order:
            dtype = alloc.types[j]
            total = sum(self._time[name].get(dtype, 0.0) for name in alloc.jobs)
            entries = []
            for i, name in enumerate(alloc.jobs):
                share = self._time[name].get(dtype, 0.0) / total if total > 0 else 0.0
                if x[i, j] <= 1e-9:
                    priority = 0.0
                elif share > 0:
                    priority = x[i, j] / share
                else:
                    priority = math.inf
                deficit = self._deficit.get(name, {}).get(dtype, 0.0)
                entries.append((priority, deficit, float(x[i, j]), i))
            entries.sort(key=lambda e: (-e[0], -e[1], -e[2], e[3]))
            out.extend((e[3], j) for e in entries)
        return out

    def _schedule(self, jobs: Sequence[JobView], cluster: ClusterState) -> Decision:
        alloc = self._allocation
        assert alloc is not None
        by_name = {j.name: j for j in jobs}
        free = {t: cluster.capacity(t) for t in alloc.types}
        scales = {j.name: self._scale(j, cluster) for j in jobs}
        chosen: dict[str, str] = {}
        # Running jobs that may not be preempted keep their type first.
        for job in jobs:
            if job.allocation is not None and not job.spec.preemptible:
                dtype = job.allocation.device_type
                chosen[job.name] = dtype
                free[dtype] -= job.allocation.num_replicas
        # This round's picks that are still active keep their devices until the round ends.
        for name, dtype in self._scheduled.items():
            if name in by_name and name not in chosen and scales[name] <= free[dtype]:
                chosen[name] = dtype
                free[dtype] -= scales[name]
        for i, j in self._order(alloc):
            name, dtype = alloc.jobs[i], alloc.types[j]
            if name in chosen or self._throughput[i, j] <= 0 or scales[name] > free[dtype]:
                continue
            chosen[name] = dtype
            free[dtype] -= scales[name]
        self._scheduled = dict(chosen)
        order = sorted(chosen, key=lambda n: (-scales[n], n))
        return {
            name: Grant(
                by_name[name].allocation.num_replicas
                if not by_name[name].spec.preemptible and by_name[name].allocation is not None
                else scales[name],
                device_type=chosen[name],
                batch_size=by_name[name].spec.batch_size,
            )
            for name in order
        }
