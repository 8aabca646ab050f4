"""Sia (SOSP'23): heterogeneity-aware goodput-optimized scheduling, as the paper describes it.

For every job j and configuration c (device type, nodes, replicas; see
:mod:`shoal.policy.configs`), the goodput matrix is normalized per job by its goodput at its
smallest configuration, ``s[j, c] = G[j, c] / min_c G[j, c]``, multiplied by the restart factor
max(T - N S, 0) / (T + S) when c differs from j's current configuration. The ILP minimizes
``sum_j sum_c x[j, c] s[j, c]^p + lambda (1 - sum_c x[j, c])`` with p = -0.5 and
lambda = 1.1: every job prefers its smallest configuration to nothing (1 < 1.1), and the
negative exponent spreads devices fairly with diminishing returns.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shoal.core.types import ClusterState, Decision, Grant, JobView
from shoal.policy.configs import ConfigTable, Row, place_configs, solve_rows
from shoal.policy.goodput_matrix import (
    candidates,
    goodput_rows,
    max_replicas,
    restart_factors,
)


class SiaPolicy:
    name = "sia"
    adapts_batch_size = True
    decides_on_arrival = False
    decides_on_completion = False

    def __init__(self, p: float = -0.5, no_alloc_penalty: float = 1.1,
                 restart_delay: float = 30.0):
        self.p = p
        self.no_alloc_penalty = no_alloc_penalty
        self.restart_delay = restart_delay
        self.last_status = ""

    def decide(self, jobs: Sequence[JobView], cluster: ClusterState, now: float) -> Decision:
        if not jobs:
            return {}
        table = ConfigTable.of(cluster)
        rows: list[Row] = []
        capacity = cluster.capacity()
        indices = [candidates(job, table, max_replicas(job, capacity)) for job in jobs]
        for job, index, goodput in zip(jobs, indices, goodput_rows(jobs, table, indices),
                                       strict=True):
            index, goodput = index[goodput > 0], goodput[goodput > 0]
            if not len(index):
                rows.append(Row(index, goodput))
                continue
            speedup = goodput / goodput.min()
            current = table.index_of(job.allocation)
            speedup = speedup * restart_factors(job, index, current, self.restart_delay)
            with np.errstate(divide="ignore"):
                rows.append(Row(index, speedup**self.p))
        idle = np.full(len(jobs), self.no_alloc_penalty)
        solution = solve_rows(rows, idle, table)
        self.last_status = solution.status
        chosen = {jobs[j].name: table.configs[c]
                  for j, c in enumerate(solution.choice) if c is not None}
        current = {j.name: j.allocation for j in jobs if j.allocation is not None}
        placed = place_configs(chosen, current, cluster)
        return {name: Grant(a.num_replicas, a.device_type, a.nodes) for name, a in placed.items()}
