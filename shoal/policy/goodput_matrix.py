"""Per-job goodput of every cluster configuration, from the models jobs report."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shoal.core.types import JobView
from shoal.policy.configs import Config


def max_replicas(job: JobView, capacity: int, growth: float = 2.0) -> int:
    """A job grows at most ``growth`` times the largest size it has run at (its model is
    trusted that far beyond what it measured)."""
    profiled = max(job.hints.max_profiled_replicas.values(), default=0)
    cap = min(max(int(growth * profiled), 1), capacity, job.limits.max_replicas)
    if job.spec.max_replicas is not None:
        cap = min(cap, job.spec.max_replicas)
    return cap


def goodput_row(
    job: JobView, configs: Sequence[Config], mask: np.ndarray | None = None
) -> np.ndarray:
    """Goodput of each configuration for ``job`` (samples/s at its initial batch size).

    Only configurations where ``mask`` is true are evaluated; the others get zero.

    A device type the job has no model for borrows the model of a type it has run on (the
    projection Sia bootstraps with); a job with no model yet is assumed to scale linearly.
    """
    models = job.hints.goodput
    out = np.zeros(len(configs))
    wanted = np.ones(len(configs), dtype=bool) if mask is None else mask
    if not models:
        return np.where(wanted, [float(c.replicas) for c in configs], 0.0)
    fallback = next(iter(models.values()))
    by_type: dict[str, list[int]] = {}
    for i, c in enumerate(configs):
        if wanted[i]:
            by_type.setdefault(c.device_type, []).append(i)
    for dtype, idx in by_type.items():
        model = models.get(dtype, fallback)
        nodes = np.array([configs[i].nodes for i in idx])
        reps = np.array([configs[i].replicas for i in idx])
        out[idx] = np.asarray(model.optimize(nodes, reps).goodput, dtype=float)
    return out


def restart_factor(job: JobView, delay: float) -> float:
    """Share of a job's life not lost to restarts if it restarts once more (Pollux's rule)."""
    return max(job.age - job.num_restarts * delay, 0.0) / (job.age + delay)


def restart_factors(job: JobView, current: int | None, count: int, delay: float) -> np.ndarray:
    """Per configuration: 1 to stay in ``current`` (or for a job not running), else the factor."""
    factor = np.ones(count)
    if job.allocation is not None:  # only a running job loses time by moving
        factor[:] = restart_factor(job, delay)
        if current is not None:
            factor[current] = 1.0
    return factor
