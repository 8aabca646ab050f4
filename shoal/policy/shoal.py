"""shoal's policy: fairness-weighted goodput over device types, exact by MILP.

What is optimized. For every active job j and every configuration c (device type, nodes,
replicas; whole nodes across nodes, powers of two within one), with binary x[j, c]:

    minimize  sum_j w_j [ sum_c x[j, c] (rho[j, c] s[j, c])^p + s0^p (1 - sum_c x[j, c]) ]

* ``s[j, c]`` is j's goodput (throughput x statistical efficiency at the best batch size for c)
  over its goodput at its smallest configuration, per device type from the job's own models;
* ``rho[j, c]`` is the restart factor max(T - N S, 0) / (T + S) when a running job would move
  (1 to stay; 1 for a job that is not running), so a move must pay for its checkpoint-restore;
* ``p`` sets the fairness of the mean being maximized (for p > 0 the costs are negated, so the
  sum of ``w s^p`` is maximized; p = 1 is total goodput, p -> 0 proportional fairness, p < 0
  fairer still); no devices count as a speedup of ``idle_speedup`` < 1, so any allocation
  beats none (with p = -0.5 and 1.1^-2 this is Sia's penalty lambda = 1.1);
* ``w_j = weight_j * (1 + R_j / H)^(-alpha) * (1 + Q_j / H)`` where ``R_j`` estimates the
  remaining device-seconds from progress and attained service (least attained service when
  nothing is known), ``Q_j`` is time spent waiting without devices, ``H`` one device-hour and
  ``alpha`` the knob between fairness (0) and average JCT (1). The waiting term grows without
  bound, so no job starves: a waiting job's weight eventually exceeds any running job's.

Subject to: at most one configuration per job, per type the replicas and the whole nodes of
multi-node configurations within the type's devices and nodes, jobs' replica bounds, rigid
jobs only at their size, non-preemptible running jobs pinned. With these shapes any feasible
choice can be packed onto nodes (see :mod:`shoal.policy.configs`), so the MILP's optimum is
the optimum of the scheduling problem as stated; HiGHS solves it exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shoal.core.types import ClusterState, Decision, Grant, JobView
from shoal.policy.configs import cluster_configs, config_of, place_configs, solve
from shoal.policy.goodput_matrix import goodput_row, max_replicas, restart_factors

DEVICE_HOUR = 3600.0


@dataclass(frozen=True)
class ShoalKnobs:
    p: float = -1.0
    idle_speedup: float = 1.1**-2  # utility of no devices, as a speedup below the smallest
    alpha: float = 0.5  # 0: fairness only; 1: strongly shortest-remaining-first
    restart_delay: float = 30.0
    growth: float = 4.0  # how far beyond its largest measured size a job may be grown
    heterogeneity: bool = True
    adapt_batch: bool = True
    restart_aware: bool = True
    remaining_work: bool = True


class ShoalPolicy:
    name = "shoal"

    def __init__(self, knobs: ShoalKnobs | None = None, **overrides):
        knobs = knobs or ShoalKnobs()
        if overrides:
            knobs = ShoalKnobs(**{**knobs.__dict__, **overrides})
        self.knobs = knobs
        self.adapts_batch_size = knobs.adapt_batch
        self._waiting_since: dict[str, float] = {}
        self.last_status = ""

    def _weight(self, job: JobView, now: float) -> float:
        k = self.knobs
        weight = job.spec.weight
        if k.remaining_work:
            progress = job.hints.progress
            attained = job.attained_service
            remaining = attained * (1 - progress) / progress if progress > 0 else attained
            weight *= (1 + remaining / DEVICE_HOUR) ** (-k.alpha)
        if job.allocation is None:
            since = self._waiting_since.setdefault(job.name, now)
            weight *= 1 + (now - since) / DEVICE_HOUR
        else:
            self._waiting_since.pop(job.name, None)
        return weight

    def decide(self, jobs: Sequence[JobView], cluster: ClusterState, now: float) -> Decision:
        if not jobs:
            return {}
        k = self.knobs
        configs = cluster_configs(cluster)
        replicas = np.array([c.replicas for c in configs])
        cost = np.full((len(jobs), len(configs)), np.inf)
        idle = np.zeros(len(jobs))
        forced: dict[int, int] = {}
        capacity = cluster.capacity()
        for j, job in enumerate(jobs):
            weight = self._weight(job, now)
            sign = 1.0 if k.p < 0 else -1.0
            idle[j] = sign * weight * k.idle_speedup**k.p
            ok = replicas <= max_replicas(job, capacity, k.growth)
            if job.spec.rigid:
                ok &= replicas == job.spec.num_replicas
            if job.spec.device_types:
                ok &= np.array([c.device_type in job.spec.device_types for c in configs])
            goodput = goodput_row(job, configs, ok)
            if not k.heterogeneity and job.hints.goodput:
                goodput = self._type_blind(goodput, configs)
            ok &= goodput > 0
            if not ok.any():
                continue
            speedup = goodput / goodput[ok].min()
            current = config_of(job.allocation, configs)
            factor = np.ones(len(configs))
            if k.restart_aware:
                factor = restart_factors(job, current, len(configs), k.restart_delay)
            with np.errstate(divide="ignore"):
                cost[j, ok] = sign * weight * (speedup[ok] * factor[ok]) ** k.p
            if not job.spec.preemptible and current is not None:
                forced[j] = current
        solution = solve(cost, idle, configs, cluster, forced)
        self.last_status = solution.status
        chosen = {jobs[j].name: configs[c] for j, c in enumerate(solution.choice) if c is not None}
        current_allocs = {j.name: j.allocation for j in jobs if j.allocation is not None}
        placed = place_configs(chosen, current_allocs, cluster)
        fixed = {j.name: j.spec.batch_size for j in jobs}
        return {
            name: Grant(a.num_replicas, a.device_type, a.nodes,
                        None if k.adapt_batch else fixed[name])
            for name, a in placed.items()
        }

    @staticmethod
    def _type_blind(goodput: np.ndarray, configs) -> np.ndarray:
        """Goodput as if every type performed like the best-known one at the same shape."""
        by_shape: dict[tuple[int, int], float] = {}
        for g, c in zip(goodput, configs, strict=True):
            key = (c.nodes, c.replicas)
            by_shape[key] = max(by_shape.get(key, 0.0), g)
        return np.array([by_shape[(c.nodes, c.replicas)] for c in configs])
