"""Goodput = throughput x statistical efficiency, and the batch size that maximizes it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from shoal.perf.efficiency import GradStats, efficiency
from shoal.perf.throughput import PerfParams, predict_step_time

_EPS = 1e-8
_BATCH_CANDIDATES = 50
_GEOM_STEPS = np.linspace(0.0, 1.0, _BATCH_CANDIDATES)[:, None]


@dataclass(frozen=True, slots=True)
class BatchChoice:
    goodput: np.ndarray | float
    atomic_bsz: np.ndarray | int
    accum_steps: np.ndarray | int


@dataclass(frozen=True)
class GoodputModel:
    """Goodput of one job on one device type, in samples per second at the initial batch size."""

    perf: PerfParams
    grad: GradStats
    init_batch_size: int
    max_batch_size: int
    min_atomic_bsz: int
    max_atomic_bsz: int

    def throughput(self, num_nodes, num_replicas, atomic_bsz, accum_steps) -> np.ndarray:
        """Samples per second."""
        step = predict_step_time(self.perf, num_nodes, num_replicas, atomic_bsz, accum_steps)
        batch = np.asarray(num_replicas) * np.asarray(atomic_bsz) * (np.asarray(accum_steps) + 1)
        return batch / step

    def evaluate(self, num_nodes, num_replicas, atomic_bsz, accum_steps) -> np.ndarray:
        batch = np.asarray(num_replicas) * np.asarray(atomic_bsz) * (np.asarray(accum_steps) + 1)
        return self.throughput(num_nodes, num_replicas, atomic_bsz, accum_steps) * efficiency(
            self.grad, batch, self.init_batch_size
        )

    def optimize(
        self, num_nodes: ArrayLike, num_replicas: ArrayLike, accumulation: bool = True
    ) -> BatchChoice:
        """Best (goodput, micro-batch, accumulation steps) for each (nodes, replicas) given.

        Candidate global batch sizes are 50 points spaced geometrically between the smallest
        allowed and the maximum. With accumulation, a local batch larger than the largest
        micro-batch is split into accumulation steps; a single replica growing its batch past
        the initial size accumulates at least once, so that gradient statistics stay
        measurable (the AdaptDL rule).
        """
        scalar = np.isscalar(num_nodes) and np.isscalar(num_replicas)
        shape = np.broadcast(num_nodes, num_replicas).shape
        nodes = np.broadcast_to(num_nodes, shape).flatten()
        replicas = np.broadcast_to(num_replicas, shape).flatten()
        min_batch = np.maximum(self.init_batch_size, self.min_atomic_bsz * replicas)
        batch = min_batch * (self.max_batch_size / min_batch) ** _GEOM_STEPS
        local = batch / replicas
        if accumulation:
            accum = np.ceil(local / self.max_atomic_bsz - _EPS) - 1
            single_grown = (replicas == 1) & (local > self.init_batch_size + _EPS)
            accum = np.where(single_grown, np.maximum(accum, 1), accum).astype(int)
        else:
            accum = np.zeros_like(local, dtype=int)
        atomic = np.ceil(local / (accum + 1) - _EPS).astype(int)
        goodput = self.evaluate(nodes, replicas, atomic, accum)
        valid = (self.min_atomic_bsz <= atomic) & (atomic <= self.max_atomic_bsz)
        goodput = np.where(valid, goodput, 0.0)
        best = np.argmax(goodput, axis=0), np.arange(goodput.shape[1])
        out_goodput = goodput[best].reshape(shape)
        out_atomic = atomic[best].reshape(shape)
        out_accum = accum[best].reshape(shape)
        if scalar:
            return BatchChoice(out_goodput.item(), int(out_atomic.item()), int(out_accum.item()))
        return BatchChoice(out_goodput, out_atomic, out_accum)


class SpeedupFunction:
    """Goodput of (nodes, replicas) relative to a base goodput, memoized for small sizes."""

    def __init__(self, model: GoodputModel, base_goodput: float | None = None, memo: int = 128):
        self.model = model
        if base_goodput is None:
            base_goodput = float(model.optimize(1, 1).goodput)
        self.base_goodput = base_goodput
        self._memo = np.full((memo, memo), -1.0)
        self._memo[0, 0] = 0.0

    def goodput(self, num_nodes, num_replicas) -> np.ndarray:
        """Best goodput at (nodes, replicas), memoized; zero replicas give zero."""
        nodes = np.asarray(num_nodes, dtype=int)
        replicas = np.asarray(num_replicas, dtype=int)
        shape = np.broadcast(nodes, replicas).shape
        nodes = np.broadcast_to(nodes, shape).ravel()
        replicas = np.broadcast_to(replicas, shape).ravel()
        size = self._memo.shape[0]
        inside = (replicas < size) & (nodes < size)
        out = np.full(nodes.shape, -1.0)
        out[inside] = self._memo[nodes[inside], replicas[inside]]
        missing = out < 0
        if np.any(missing):
            pairs, inverse = np.unique(
                np.stack([nodes[missing], replicas[missing]]), axis=1, return_inverse=True
            )
            computed = np.zeros(pairs.shape[1])
            busy = pairs[1] > 0
            if np.any(busy):
                choice = self.model.optimize(pairs[0][busy], pairs[1][busy])
                computed[busy] = choice.goodput
            keep = (pairs[1] < size) & (pairs[0] < size)
            self._memo[pairs[0][keep], pairs[1][keep]] = computed[keep]
            out[missing] = computed[np.ravel(inverse)]
        return out.reshape(shape)

    def __call__(self, num_nodes, num_replicas):
        result = self.goodput(num_nodes, num_replicas) / self.base_goodput
        return float(result) if np.ndim(result) == 0 else result


def optimize_many(
    models: list[GoodputModel], model_of: np.ndarray, num_nodes: np.ndarray,
    num_replicas: np.ndarray, accumulation: bool = True,
) -> np.ndarray:
    """Best goodput of many (model, nodes, replicas) triples in one vectorized pass.

    Pair ``i`` is ``models[model_of[i]]`` at ``(num_nodes[i], num_replicas[i])``; the result
    equals ``models[model_of[i]].optimize(num_nodes[i], num_replicas[i]).goodput``. Deciding
    for thousands of jobs, one pass over all pairs is much faster than a call per job.
    """
    if not len(model_of):
        return np.zeros(0)
    fields = np.array([
        (*m.perf.as_tuple(), m.grad.sqr, m.grad.var, m.init_batch_size, m.max_batch_size,
         m.min_atomic_bsz, m.max_atomic_bsz) for m in models
    ], dtype=float)[model_of].T
    ac, bc, an, bn, ar, br, g, sqr, var, init, max_batch, min_atomic, max_atomic = fields
    nodes = np.asarray(num_nodes, dtype=float)
    replicas = np.asarray(num_replicas, dtype=float)
    min_batch = np.maximum(init, min_atomic * replicas)
    batch = min_batch * (max_batch / min_batch) ** _GEOM_STEPS
    local = batch / replicas
    if accumulation:
        accum = np.ceil(local / max_atomic - _EPS) - 1
        single_grown = (replicas == 1) & (local > init + _EPS)
        accum = np.where(single_grown, np.maximum(accum, 1), accum)
    else:
        accum = np.zeros_like(local)
    atomic = np.ceil(local / (accum + 1) - _EPS)
    # The scalar models' formulas broadcast over per-pair parameter arrays unchanged.
    perf = PerfParams(ac, bc, an, bn, ar, br, g)
    used = replicas * atomic * (accum + 1)
    goodput = used / predict_step_time(perf, nodes, replicas, atomic, accum) * efficiency(
        GradStats(sqr, var), used, init)
    valid = (min_atomic <= atomic) & (atomic <= max_atomic)
    return np.where(valid, goodput, 0.0).max(axis=0)
