"""Allocation configurations and the exact MILP that picks one per job (shared by sia and shoal).

A configuration is (device type, nodes, replicas): on one node a power of two up to the node
size, across nodes whole nodes only. With such shapes, any choice whose device and whole-node
counts fit each type's totals can be placed without fragmentation (buddy packing), so the MILP
needs no per-node variables and its optimum is an optimum over placements too.

The MILP: binary x[j, c]; at most one configuration per job; per device type, replicas <= the
type's devices and multi-node configurations' nodes <= the type's nodes; minimize
sum_j sum_c cost[j, c] x[j, c] + sum_j idle[j] (1 - sum_c x[j, c]). Solved with HiGHS through
scipy.optimize.milp.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from shoal.core.types import Allocation, ClusterState


@dataclass(frozen=True, slots=True)
class Config:
    device_type: str
    nodes: int
    replicas: int


def cluster_configs(cluster: ClusterState) -> list[Config]:
    out: list[Config] = []
    for dtype in cluster.device_types:
        nodes = cluster.nodes_of(dtype)
        per_node = max(n.capacity for n in nodes)
        size = 1
        while size < per_node:
            out.append(Config(dtype, 1, size))
            size *= 2
        out.append(Config(dtype, 1, per_node))
        for count in range(2, len(nodes) + 1):
            out.append(Config(dtype, count, count * per_node))
    return out


def config_of(alloc: Allocation | None, configs: Sequence[Config]) -> int | None:
    """Index of the configuration an existing allocation has, if it has one."""
    if alloc is None:
        return None
    for i, c in enumerate(configs):
        if (c.device_type, c.nodes, c.replicas) == (
            alloc.device_type, alloc.num_nodes, alloc.num_replicas
        ):
            return i
    return None


@dataclass
class Solution:
    choice: list[int | None]  # configuration index per job, None = no allocation
    objective: float
    status: str


def _dominated(cost: np.ndarray, configs: Sequence[Config]) -> np.ndarray:
    """Configurations no optimum needs: a smaller one of the same type costs no more.

    Within a type, configurations are totally ordered in what they use (single-node powers of
    two, then 2, 3, ... whole nodes), so each uses at least the devices and whole nodes of every
    earlier one. A configuration is dominated when some earlier one costs no more; dropping it
    keeps the optimum exact and shrinks the MILP. One running minimum per type: O(jobs x configs).
    """
    out = np.zeros(cost.shape, dtype=bool)
    by_type: dict[str, list[int]] = {}
    for i, c in enumerate(configs):
        by_type.setdefault(c.device_type, []).append(i)
    for idx in by_type.values():
        idx = sorted(idx, key=lambda i: (configs[i].nodes > 1, configs[i].replicas))
        block = cost[:, idx]
        best_before = np.minimum.accumulate(block, axis=1)
        out[:, idx[1:]] = best_before[:, :-1] <= block[:, 1:]
    return out


def solve(
    cost: np.ndarray,
    idle: np.ndarray,
    configs: Sequence[Config],
    cluster: ClusterState,
    forced: Mapping[int, int] | None = None,
    time_limit: float = 10.0,
) -> Solution:
    """Exact configuration choice. ``cost[j, c] = inf`` forbids c for j; ``forced`` pins j->c."""
    jobs = cost.shape[0]
    allowed = np.isfinite(cost) & ~_dominated(cost, configs)
    for j, c in (forced or {}).items():
        allowed[j] = False
        allowed[j, c] = True
    js, cs = np.nonzero(allowed)
    nvar = len(js)
    if nvar == 0:
        return Solution([None] * jobs, float(idle.sum()), "empty")
    objective = cost[js, cs] - idle[js]
    rows, cols, vals, lower, upper = [], [], [], [], []
    # One configuration per job (exactly one when forced).
    for var, j in enumerate(js):
        rows.append(j)
        cols.append(var)
        vals.append(1.0)
    lower.extend(1.0 if j in (forced or {}) else 0.0 for j in range(jobs))
    upper.extend([1.0] * jobs)
    row = jobs
    for dtype in cluster.device_types:
        nodes = cluster.nodes_of(dtype)
        for var, c in enumerate(cs):
            cfg = configs[c]
            if cfg.device_type == dtype:
                rows.append(row)
                cols.append(var)
                vals.append(float(cfg.replicas))
                if cfg.nodes > 1:
                    rows.append(row + 1)
                    cols.append(var)
                    vals.append(float(cfg.nodes))
        lower.extend([0.0, 0.0])
        upper.extend([float(cluster.capacity(dtype)), float(len(nodes))])
        row += 2
    matrix = coo_matrix((vals, (rows, cols)), shape=(row, nvar)).tocsr()
    result = milp(
        objective,
        constraints=LinearConstraint(matrix, lower, upper),
        integrality=np.ones(nvar),
        bounds=Bounds(0, 1),
        options={"time_limit": time_limit, "mip_rel_gap": 1e-6},
    )
    if result.x is None:
        raise RuntimeError(f"allocation MILP failed: {result.message}")
    choice: list[int | None] = [None] * jobs
    for var in np.nonzero(result.x > 0.5)[0]:
        choice[js[var]] = int(cs[var])
    status = "optimal" if result.status == 0 else f"feasible ({result.message})"
    return Solution(choice, float(result.fun + idle.sum()), status)


def place_configs(
    chosen: Mapping[str, Config], current: Mapping[str, Allocation], cluster: ClusterState
) -> dict[str, Allocation]:
    """Concrete nodes for chosen configurations: keep unchanged jobs, then buddy-pack the rest.

    Multi-node configurations take whole free nodes; single-node ones go, largest first, to the
    fullest node they fit (best fit), which keeps power-of-two blocks aligned.
    """
    free = {n.node_id: n.capacity for n in cluster.nodes}
    dtype_of = {n.node_id: n.device_type for n in cluster.nodes}
    placed: dict[str, Allocation] = {}
    for name, cfg in chosen.items():
        old = current.get(name)
        if old is not None and (old.device_type, old.num_nodes, old.num_replicas) == (
            cfg.device_type, cfg.nodes, cfg.replicas
        ) and all(free[n] >= c for n, c in old.per_node().items()):
            placed[name] = old
            for n, c in old.per_node().items():
                free[n] -= c
    order = sorted((n for n in chosen if n not in placed),
                   key=lambda n: (-chosen[n].nodes, -chosen[n].replicas, n))
    for name in order:
        cfg = chosen[name]
        nodes = [n for n in free if dtype_of[n] == cfg.device_type]
        if cfg.nodes > 1:
            per = cfg.replicas // cfg.nodes
            whole = sorted((n for n in nodes if free[n] >= per), key=lambda n: (-free[n], n))
            if len(whole) < cfg.nodes:
                continue
            take = sorted(whole[: cfg.nodes])
            placed[name] = Allocation(cfg.device_type, tuple(n for n in take for _ in range(per)))
            for n in take:
                free[n] -= per
        else:
            fits = [n for n in nodes if free[n] >= cfg.replicas]
            if not fits:
                continue
            node = min(fits, key=lambda n: (free[n], n))
            placed[name] = Allocation(cfg.device_type, (node,) * cfg.replicas)
            free[node] -= cfg.replicas
    return placed
