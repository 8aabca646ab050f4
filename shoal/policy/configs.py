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

import bisect
import functools
import itertools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, OptimizeResult, linprog, milp
from scipy.sparse import coo_matrix, csr_matrix

from shoal.core.types import Allocation, ClusterState

_INTEGRAL = 1e-6  # an LP value this close to 0 or 1 counts as integral

log = logging.getLogger(__name__)


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


def inexact_types(cluster: ClusterState) -> list[str]:
    """Device types whose nodes are not all of one power-of-two size. On those the MILP's
    device and node counts are looser than placement (a relaxation; docs/theory.md, part 1)."""
    return _inexact(_node_sizes(cluster))


def _warn_if_inexact(cluster: ClusterState) -> None:
    """Log once per cluster shape when the MILP's optimum may not be placeable as chosen."""
    _warn_once(_node_sizes(cluster))


_NodeSizes = tuple[tuple[str, frozenset[int]], ...]


def _node_sizes(cluster: ClusterState) -> _NodeSizes:
    return tuple((t, frozenset(n.capacity for n in cluster.nodes_of(t)))
                 for t in cluster.device_types)


def _inexact(sizes: _NodeSizes) -> list[str]:
    return [t for t, found in sizes if len(found) > 1 or max(found) & (max(found) - 1)]


@functools.cache
def _warn_once(sizes: _NodeSizes) -> None:
    bad = _inexact(sizes)
    if bad:
        log.warning(
            "device type(s) %s have nodes of %s devices, not one power of two per type: the "
            "allocation MILP counts devices only, so a chosen configuration may not fit on the "
            "nodes and its job then waits a round; use nodes of 1, 2, 4, 8, ... devices per type "
            "for exact decisions", ", ".join(bad),
            {t: sorted(found) for t, found in sizes if t in bad})


@dataclass
class Solution:
    choice: list[int | None]  # configuration index per job, None = no allocation
    objective: float
    status: str


@dataclass(frozen=True)
class ConfigTable:
    """A cluster's configurations as arrays, for building cost rows without Python loops."""

    configs: list[Config]
    types: tuple[str, ...]
    type_index: np.ndarray  # per configuration, index into ``types``
    nodes: np.ndarray
    replicas: np.ndarray
    lookup: dict[tuple[str, int, int], int]
    devices: np.ndarray  # per type in ``types``: its devices
    node_counts: np.ndarray  # per type in ``types``: its nodes

    @classmethod
    def of(cls, cluster: ClusterState, configs: Sequence[Config] | None = None) -> ConfigTable:
        """The table of ``configs`` (default: all of the cluster's configurations). Warns once
        per cluster shape where counting devices is looser than placing them."""
        _warn_if_inexact(cluster)
        configs = cluster_configs(cluster) if configs is None else list(configs)
        types = tuple(cluster.device_types)
        return cls(
            configs, types,
            np.array([types.index(c.device_type) for c in configs], dtype=int),
            np.array([c.nodes for c in configs], dtype=int),
            np.array([c.replicas for c in configs], dtype=int),
            {(c.device_type, c.nodes, c.replicas): i for i, c in enumerate(configs)},
            np.array([cluster.capacity(t) for t in types], dtype=int),
            np.array([len(cluster.nodes_of(t)) for t in types], dtype=int),
        )

    def index_of(self, alloc: Allocation | None) -> int | None:
        if alloc is None:
            return None
        return self.lookup.get((alloc.device_type, alloc.num_nodes, alloc.num_replicas))

    def type_mask(self, allowed: Sequence[str] | None) -> np.ndarray:
        if not allowed:
            return np.ones(len(self.configs), dtype=bool)
        wanted = [i for i, t in enumerate(self.types) if t in allowed]
        return np.isin(self.type_index, wanted)


@dataclass
class Row:
    """One job's candidate configurations (ascending indices) and their costs."""

    index: np.ndarray
    cost: np.ndarray


def undominated_rows(rows: Sequence[Row], type_index: np.ndarray) -> list[Row]:
    """Drop configurations no optimum needs: a smaller one of the same type costs no more.

    Within a type, configurations are totally ordered in what they use (single-node powers of
    two, then 2, 3, ... whole nodes; :func:`cluster_configs` lists them in that order), so each
    uses at least the devices and whole nodes of every earlier one. A configuration is dominated
    when some earlier one costs no more; dropping it keeps the optimum exact and shrinks the MILP.
    All rows are done at once with one padded running minimum per (job, type) segment.
    """
    sizes = np.array([len(r.index) for r in rows], dtype=int)
    if not sizes.sum():
        return list(rows)
    job = np.repeat(np.arange(len(rows)), sizes)
    index = np.concatenate([r.index for r in rows]).astype(int)
    cost = np.concatenate([r.cost for r in rows]).astype(float)
    # Segments are (job, type) runs; rows list a job's configurations in config order, so a
    # stable sort by (job, type) keeps each type's configurations in order.
    order = np.lexsort((type_index[index], job))
    segment_key = job[order] * (int(type_index.max(initial=0)) + 1) + type_index[index[order]]
    starts = np.flatnonzero(np.r_[True, segment_key[1:] != segment_key[:-1]])
    segment = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(order)]))
    position = np.arange(len(order)) - starts[segment]
    padded = np.full((len(starts), int(position.max()) + 1), np.inf)
    padded[segment, position] = cost[order]
    prefix_min = np.minimum.accumulate(padded, axis=1)
    keep_sorted = np.ones(len(order), dtype=bool)
    later = position > 0
    keep_sorted[later] = (prefix_min[segment[later], position[later] - 1]
                          > cost[order][later])
    keep = np.empty(len(order), dtype=bool)
    keep[order] = keep_sorted
    bounds = np.r_[0, np.cumsum(sizes)]
    return [Row(index[a:b][keep[a:b]], cost[a:b][keep[a:b]])
            for a, b in itertools.pairwise(bounds.tolist())]


def solve(
    cost: np.ndarray,
    idle: np.ndarray,
    configs: Sequence[Config],
    cluster: ClusterState,
    forced: Mapping[int, int] | None = None,
    time_limit: float = 10.0,
) -> Solution:
    """Exact configuration choice. ``cost[j, c] = inf`` forbids c for j; ``forced`` pins j->c."""
    rows = []
    for j in range(cost.shape[0]):
        index = np.nonzero(np.isfinite(cost[j]))[0]
        rows.append(Row(index, cost[j, index]))
    return solve_rows(rows, idle, ConfigTable.of(cluster, configs), forced, time_limit)


def solve_rows(
    rows: Sequence[Row],
    idle: np.ndarray,
    table: ConfigTable,
    forced: Mapping[int, int] | None = None,
    time_limit: float = 10.0,
) -> Solution:
    """Exact configuration choice from per-job candidate rows (indices into ``table``);
    ``forced`` pins job j to configuration c."""
    jobs = len(rows)
    forced = dict(forced or {})
    device_types = table.types
    type_index = table.type_index
    # An infinite cost forbids a configuration (e.g. a move whose restart could never pay off).
    finite = [Row(r.index[np.isfinite(r.cost)], r.cost[np.isfinite(r.cost)]) for r in rows]
    kept = list(undominated_rows(finite, type_index))
    for j, c in forced.items():
        at = np.nonzero(rows[j].index == c)[0]
        kept[j] = Row(np.array([c], dtype=int), rows[j].cost[at] if len(at) else np.zeros(1))
    sizes = [len(r.index) for r in kept]
    nvar = sum(sizes)
    if nvar == 0:
        return Solution([None] * jobs, float(idle.sum()), "empty")
    js = np.repeat(np.arange(jobs), sizes)
    cs = np.concatenate([r.index for r in kept]).astype(int)
    objective = np.concatenate([r.cost for r in kept]) - idle[js]
    replicas = table.replicas[cs].astype(float)
    nodes = table.nodes[cs].astype(float)
    var_type = type_index[cs]
    # Constraint rows: one per job (at most one configuration; exactly one when forced), then
    # per type its devices and the whole nodes of its multi-node configurations.
    multi = np.nonzero(nodes > 1)[0]
    num_rows = jobs + 2 * len(device_types)
    matrix = coo_matrix(
        (
            np.concatenate([np.ones(nvar), replicas, nodes[multi]]),
            (
                np.concatenate([js, jobs + 2 * var_type, jobs + 2 * var_type[multi] + 1]),
                np.concatenate([np.arange(nvar), np.arange(nvar), multi]),
            ),
        ),
        shape=(num_rows, nvar),
    ).tocsr()
    upper = np.ones(num_rows)
    upper[jobs::2] = table.devices
    upper[jobs + 1::2] = table.node_counts
    pinned = sorted(forced)
    relaxation = _solve_relaxation(objective, matrix, upper, pinned)
    x = _integral(relaxation, matrix, upper, pinned)
    if x is not None:
        value, status = float(objective @ x), "optimal"
    elif relaxation is not None:
        x, value, status = _solve_with_fixing(relaxation, objective, matrix, upper, pinned,
                                              time_limit)
    else:
        x, value, status = _solve_integer(objective, matrix, upper, pinned, time_limit)
    choice: list[int | None] = [None] * jobs
    for var in np.nonzero(x > 0.5)[0]:
        choice[js[var]] = int(cs[var])
    return Solution(choice, value + float(idle.sum()), status)


def _solve_relaxation(objective: np.ndarray, matrix: csr_matrix, upper: np.ndarray,
                      forced: list[int]) -> OptimizeResult | None:
    """The LP relaxation at an optimal vertex (interior point, then crossover), or None.

    On these multiple-choice problems with a few capacity rows its optimum is often integral
    (a vertex has at most as many fractional jobs as there are capacity rows), and HiGHS's
    interior point with crossover finds it 2-3x faster than branch and bound starts.
    """
    is_forced = np.zeros(matrix.shape[0], dtype=bool)
    is_forced[forced] = True
    free = ~is_forced
    result = linprog(
        objective,
        A_ub=matrix[free], b_ub=upper[free],
        A_eq=matrix[is_forced] if forced else None, b_eq=upper[is_forced] if forced else None,
        bounds=(0, 1), method="highs-ipm",
    )
    if result.status != 0 or result.x is None:
        return None
    return result


def _integral(relaxation: OptimizeResult | None, matrix: csr_matrix, upper: np.ndarray,
              forced: list[int]) -> np.ndarray | None:
    """The relaxation's solution when it is integral, which is then a MILP optimum too (the
    relaxation's optimum bounds the MILP's from below); None otherwise."""
    if relaxation is None:
        return None
    x = relaxation.x
    if np.any((x > _INTEGRAL) & (x < 1 - _INTEGRAL)):
        return None
    x = np.round(x)
    usage = matrix @ x
    if np.any(usage > upper + _INTEGRAL) or np.any(usage[forced] < 1):
        return None
    return x


def _solve_with_fixing(relaxation: OptimizeResult, objective: np.ndarray, matrix: csr_matrix,
                       upper: np.ndarray, forced: list[int],
                       time_limit: float) -> tuple[np.ndarray, float, str]:
    """Exact MILP optimum from a fractional relaxation, by reduced-cost fixing.

    Rounding the fractional variables down is feasible (every constraint is a packing row
    with nonnegative coefficients, and pinned jobs have a single, integral variable): value
    ``incumbent``. LP duality bounds any solution that moves a variable off its LP bound by the
    relaxation's optimum plus the variable's reduced cost. A variable whose reduced cost
    exceeds ``incumbent - relaxation`` therefore keeps its bound in every solution better than
    the incumbent, and is fixed there. The MILP over the remaining variables is small. The
    result is the better of its optimum and the incumbent.
    """
    x = relaxation.x
    at_one = x > 1 - _INTEGRAL
    incumbent = at_one.astype(float)
    bound = float(relaxation.fun)
    incumbent_value = float(objective @ incumbent)
    gap = incumbent_value - bound
    slack = 1e-9 * max(1.0, abs(bound))
    fix_zero = (x < _INTEGRAL) & (relaxation.lower.marginals > gap + slack)
    fix_one = at_one & (-relaxation.upper.marginals > gap + slack)
    free = np.nonzero(~(fix_zero | fix_one))[0]
    best, best_value, status = incumbent, incumbent_value, "optimal"
    if len(free):
        used = matrix @ fix_one.astype(float)
        lower = np.zeros(matrix.shape[0])
        lower[forced] = 1.0
        sub = _binary_milp(objective[free], matrix[:, free], lower - used, upper - used,
                           time_limit)
        if sub.x is not None:
            candidate = fix_one.astype(float)
            candidate[free] = np.round(sub.x)
            value = float(objective @ candidate)
            if value < best_value:
                best, best_value = candidate, value
            if sub.status != 0:
                status = f"feasible ({sub.message})"
    return best, best_value, status


def _solve_integer(objective: np.ndarray, matrix: csr_matrix, upper: np.ndarray,
                   forced: list[int], time_limit: float) -> tuple[np.ndarray, float, str]:
    lower = np.zeros(matrix.shape[0])
    lower[forced] = 1.0
    result = _binary_milp(objective, matrix, lower, upper, time_limit)
    if result.x is None:
        raise RuntimeError(f"allocation MILP failed: {result.message}")
    status = "optimal" if result.status == 0 else f"feasible ({result.message})"
    return result.x, float(result.fun), status


def _binary_milp(objective: np.ndarray, matrix: csr_matrix, lower: np.ndarray,
                 upper: np.ndarray, time_limit: float) -> OptimizeResult:
    """min objective @ x over binary x with lower <= matrix @ x <= upper (HiGHS)."""
    return milp(
        objective,
        constraints=LinearConstraint(matrix, lower, upper),
        integrality=np.ones(len(objective)),
        bounds=Bounds(0, 1),
        # HiGHS's presolve costs 4-8x the solve itself on these near-integral multiple-choice
        # problems (bench/decision_time.py); the optimum is the same without it.
        options={"time_limit": time_limit, "mip_rel_gap": 1e-6, "presolve": False},
    )


class _FreeNodes:
    """Nodes of each type bucketed by free devices, ids kept sorted within a bucket."""

    def __init__(self, free: dict[int, int], dtype_of: dict[int, str]):
        self.free = free
        self.dtype_of = dtype_of
        self.buckets: dict[tuple[str, int], list[int]] = {}
        for n in sorted(free):
            self.buckets.setdefault((dtype_of[n], free[n]), []).append(n)

    def take(self, node: int, count: int) -> None:
        key = (self.dtype_of[node], self.free[node])
        bucket = self.buckets[key]
        bucket.pop(bisect.bisect_left(bucket, node))
        self.free[node] -= count
        bisect.insort(self.buckets.setdefault((key[0], self.free[node]), []), node)

    def best_fit(self, dtype: str, count: int, max_free: int) -> int | None:
        """The lowest-id node among those with the fewest free devices that still fit ``count``."""
        for amount in range(count, max_free + 1):
            bucket = self.buckets.get((dtype, amount))
            if bucket:
                return bucket[0]
        return None

    def empty_nodes(self, dtype: str, per_node: int, count: int) -> list[int]:
        """``count`` lowest-id nodes with at least ``per_node`` free devices, or [] if too few."""
        out: list[int] = []
        for (t, amount), bucket in sorted(self.buckets.items()):
            if t == dtype and amount >= per_node:
                out.extend(bucket)
        out.sort()
        return out[:count] if len(out) >= count else []


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
    pool = _FreeNodes(free, dtype_of)
    max_free = {t: cluster.largest_node(t) for t in cluster.device_types}
    order = sorted((n for n in chosen if n not in placed),
                   key=lambda n: (-chosen[n].nodes, -chosen[n].replicas, n))
    for name in order:
        cfg = chosen[name]
        if cfg.nodes > 1:
            per = cfg.replicas // cfg.nodes
            take = pool.empty_nodes(cfg.device_type, per, cfg.nodes)
            if not take:
                continue
            placed[name] = Allocation(cfg.device_type, tuple(n for n in take for _ in range(per)))
            for n in take:
                pool.take(n, per)
        else:
            node = pool.best_fit(cfg.device_type, cfg.replicas, max_free[cfg.device_type])
            if node is None:
                continue
            placed[name] = Allocation(cfg.device_type, (node,) * cfg.replicas)
            pool.take(node, cfg.replicas)
    return placed
