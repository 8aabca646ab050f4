"""Gradient noise scale from per-replica (or per-micro-step) gradients, as AdaptDL does.

A gradient averaged over ``b`` samples has ``E|g_b|^2 = |G|^2 + tr(Sigma) / b``. Each step gives
several *pieces* (one per replica, or one per accumulation micro-step on a single replica), each
averaged over its own ``b_j`` samples, and their combination over the whole batch ``B``. Two
equations, two unknowns::

    mean_j |g_j|^2 = |G|^2 + tr(Sigma) * mean_j(1 / b_j)
    |g_B|^2        = |G|^2 + tr(Sigma) / B

The estimates are noisy, so both are smoothed with a bias-corrected exponential moving average.
Reported at the initial batch size ``M0`` like Pollux: ``grad_sqr = |G|^2``,
``grad_var = tr(Sigma) / M0``, so the noise scale is ``M0 * grad_var / grad_sqr``.
"""

from __future__ import annotations

from typing import Any

from shoal.perf.efficiency import GradStats


class NoiseScaleEstimator:
    def __init__(self, smoothing: float = 0.9) -> None:
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing={smoothing} must be in [0, 1)")
        self.smoothing = smoothing
        self._sqr = 0.0
        self._trace = 0.0
        self._weight = 0.0  # bias correction: sum of EMA weights so far
        self.updates = 0

    def update(
        self, piece_sqr_mean: float, inv_piece_size_mean: float, total_sqr: float, batch_size: int
    ) -> bool:
        """Fold in one step's measurement; False when the step carries no information."""
        spread = inv_piece_size_mean - 1.0 / batch_size
        if spread <= 0.0:
            return False
        trace = (piece_sqr_mean - total_sqr) / spread
        sqr = total_sqr - trace / batch_size
        a = self.smoothing
        self._sqr = a * self._sqr + (1 - a) * sqr
        self._trace = a * self._trace + (1 - a) * trace
        self._weight = a * self._weight + (1 - a)
        self.updates += 1
        return True

    def stats(self, init_batch_size: int) -> GradStats | None:
        """Smoothed statistics at the initial batch size, or None before the first estimate."""
        if self._weight == 0.0:
            return None
        sqr = self._sqr / self._weight
        var = max(self._trace / self._weight, 0.0) / init_batch_size
        # A non-positive |G|^2 estimate means the gradient is all noise at this precision.
        return GradStats(sqr=max(sqr, 1e-30), var=var)

    def state_dict(self) -> dict[str, Any]:
        return {
            "sqr": self._sqr,
            "trace": self._trace,
            "weight": self._weight,
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._sqr = float(state["sqr"])
        self._trace = float(state["trace"])
        self._weight = float(state["weight"])
        self.updates = int(state["updates"])
