"""Per-job goodput of every cluster configuration, from the models jobs report."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from shoal.core.types import JobView
from shoal.perf.goodput import GoodputModel, optimize_many
from shoal.policy.configs import ConfigTable


def replica_bound(job: JobView, capacity: int) -> int:
    """The most replicas a job may have: the cluster's devices, its limits and its spec."""
    bound = min(capacity, job.limits.max_replicas)
    return bound if job.spec.max_replicas is None else min(bound, job.spec.max_replicas)


def max_replicas(job: JobView, capacity: int, growth: float = 2.0) -> int:
    """A job grows at most ``growth`` times the largest size it has run at (its model is
    trusted that far beyond what it measured)."""
    profiled = max(job.hints.max_profiled_replicas.values(), default=0)
    return min(max(int(growth * profiled), 1), replica_bound(job, capacity))


def goodput_row(job: JobView, table: ConfigTable, index: np.ndarray) -> np.ndarray:
    """Goodput (samples/s at the initial batch size) of configurations ``index`` for ``job``.

    A device type the job has no model for borrows the model of a type it has run on (the
    projection Sia bootstraps with); a job with no model yet is assumed to scale linearly.
    """
    models = job.hints.goodput
    if not models:
        return table.replicas[index].astype(float)
    out = np.zeros(len(index))
    fallback = next(iter(models.values()))
    types = table.type_index[index]
    for t in np.unique(types):
        at = np.nonzero(types == t)[0]
        model = models.get(table.types[t], fallback)
        chosen = index[at]
        out[at] = np.asarray(
            model.optimize(table.nodes[chosen], table.replicas[chosen]).goodput, dtype=float)
    return out


def goodput_rows(jobs: Sequence[JobView], table: ConfigTable, indices: Sequence[np.ndarray],
                 fixed_batch: bool = False) -> list[np.ndarray]:
    """:func:`goodput_row` of every job at once: one vectorized pass over all pairs.

    With ``fixed_batch`` jobs run at a fixed global batch (a policy that does not adapt batch
    sizes): the user's ``batch_size``, which such a policy grants, else the model's initial
    batch. Goodput is evaluated at that batch, and configurations whose replicas would each get
    less than the smallest micro-batch the job runs with get none.
    """
    models: list[GoodputModel] = []
    slot: dict[tuple[int, int | None], int] = {}
    model_of: list[np.ndarray] = []
    linear: list[np.ndarray] = []
    custom: dict[int, np.ndarray] = {}
    for j, (job, index) in enumerate(zip(jobs, indices, strict=True)):
        by_type = job.hints.goodput
        # Models of other kinds (e.g. planned large-model jobs) evaluate themselves.
        if by_type and not all(type(m) is GoodputModel for m in by_type.values()):
            custom[j] = goodput_row(job, table, index)
        linear.append(np.full(len(index), not by_type or j in custom))
        if not by_type or j in custom:
            model_of.append(np.zeros(len(index), dtype=int))
            continue
        fallback = next(iter(by_type.values()))
        per_type = np.empty(len(table.types), dtype=int)
        for t, name in enumerate(table.types):
            model = by_type.get(name, fallback)
            batch = (job.spec.batch_size or model.init_batch_size) if fixed_batch else None
            per_type[t] = slot.setdefault((id(model), batch), len(models))
            if per_type[t] == len(models):
                models.append(model if batch is None else dataclasses.replace(
                    model, init_batch_size=batch, max_batch_size=batch))
        model_of.append(per_type[table.type_index[index]])
    flat = np.concatenate(indices) if indices else np.zeros(0, dtype=int)
    is_linear = np.concatenate(linear) if linear else np.zeros(0, dtype=bool)
    out = table.replicas[flat].astype(float)
    modelled = ~is_linear
    if models and modelled.any():
        which = np.concatenate(model_of)[modelled]
        replicas = table.replicas[flat[modelled]]
        goodput = optimize_many(models, which, table.nodes[flat[modelled]], replicas)
        if fixed_batch:
            smallest = np.array([m.min_atomic_bsz for m in models])[which]
            batch = np.array([m.init_batch_size for m in models])[which]
            goodput = np.where(replicas * smallest <= batch, goodput, 0.0)
        out[modelled] = goodput
    rows = np.split(out, np.cumsum([len(i) for i in indices])[:-1])
    for j, row in custom.items():
        rows[j] = row
    return rows


def candidates(job: JobView, table: ConfigTable, cap: int,
               single_node_cap: int | None = None) -> np.ndarray:
    """Configurations a job may take: within its replica cap (``single_node_cap`` instead for
    configurations on one node, when given), its allowed types, its rigidity. A rigid job
    runs at its own size whatever it has measured: the cap bounds exploration, which a rigid
    job does not do."""
    if job.spec.rigid:
        ok = table.replicas == job.spec.num_replicas
    else:
        ok = table.replicas <= cap
        if single_node_cap is not None:
            ok |= (table.nodes == 1) & (table.replicas <= single_node_cap)
    if job.spec.device_types:
        ok &= table.type_mask(job.spec.device_types)
    return np.nonzero(ok)[0]


def restart_factor(job: JobView, delay: float) -> float:
    """Share of a job's life not lost to restarts if it restarts once more (Pollux's rule)."""
    return max(job.age - job.num_restarts * delay, 0.0) / (job.age + delay)


def restart_factors(job: JobView, index: np.ndarray, current: int | None,
                    delay: float) -> np.ndarray:
    """Per candidate: 1 to stay in ``current`` (or for a job not running), else the factor."""
    factor = np.ones(len(index))
    if job.allocation is not None:  # only a running job loses time by moving
        factor[:] = restart_factor(job, delay)
        if current is not None:
            factor[index == current] = 1.0
    return factor
