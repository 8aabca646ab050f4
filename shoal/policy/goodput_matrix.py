"""Per-job goodput of every cluster configuration, from the models jobs report."""

from __future__ import annotations

import numpy as np

from shoal.core.types import JobView
from shoal.policy.configs import ConfigTable


def max_replicas(job: JobView, capacity: int, growth: float = 2.0) -> int:
    """A job grows at most ``growth`` times the largest size it has run at (its model is
    trusted that far beyond what it measured)."""
    profiled = max(job.hints.max_profiled_replicas.values(), default=0)
    cap = min(max(int(growth * profiled), 1), capacity, job.limits.max_replicas)
    if job.spec.max_replicas is not None:
        cap = min(cap, job.spec.max_replicas)
    return cap


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


def candidates(job: JobView, table: ConfigTable, cap: int) -> np.ndarray:
    """Configurations a job may take: within its replica cap, its allowed types, its rigidity."""
    ok = table.replicas <= cap
    if job.spec.rigid:
        ok &= table.replicas == job.spec.num_replicas
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
