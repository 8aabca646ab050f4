"""Statistical efficiency of large-batch SGD from the gradient noise scale.

With measured squared gradient norm ``sqr = |G|^2`` and gradient variance ``var = tr(Sigma)``
at the user's batch size ``M0``, the gradient noise scale is ``phi = M0 * var / sqr`` and the
efficiency of a global batch ``M`` relative to ``M0`` is ``E(M) = (phi + M0) / (phi + M)``.
``gain`` is the progress one step at batch ``M`` makes in units of steps at ``M0``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike


@dataclass(frozen=True, slots=True)
class GradStats:
    """Gradient statistics measured at the initial (user) batch size."""

    sqr: float
    var: float

    def noise_scale(self, init_batch_size: float) -> float:
        """The gradient noise scale phi in samples."""
        return float(init_batch_size * self.var / self.sqr) if self.sqr > 0 else float("inf")


def gain(stats: GradStats, batch_size: ArrayLike, init_batch_size: float) -> np.ndarray:
    """Progress of one step at ``batch_size``, in steps at ``init_batch_size``."""
    scale = np.asarray(batch_size, dtype=float) / init_batch_size
    denom = stats.var / scale + stats.sqr
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denom > 0, (stats.var + stats.sqr) / denom, 1.0)


def efficiency(stats: GradStats, batch_size: ArrayLike, init_batch_size: float) -> np.ndarray:
    """E(M) = (phi + M0) / (phi + M): per-sample progress relative to the initial batch size."""
    scale = np.asarray(batch_size, dtype=float) / init_batch_size
    return gain(stats, batch_size, init_batch_size) / scale
