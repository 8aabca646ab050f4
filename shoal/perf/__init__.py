"""Performance models: throughput, statistical efficiency and goodput of training jobs.

The models that need SciPy are imported on first use, so that a training process, which needs
only the statistical efficiency (``shoal.train``), does not pay for SciPy's import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from shoal.perf.efficiency import GradStats, efficiency

if TYPE_CHECKING:
    from shoal.perf.goodput import GoodputModel, SpeedupFunction
    from shoal.perf.throughput import PerfParams, fit_perf_params

_WHERE = {
    "GoodputModel": "shoal.perf.goodput",
    "PerfParams": "shoal.perf.throughput",
    "SpeedupFunction": "shoal.perf.goodput",
    "fit_perf_params": "shoal.perf.throughput",
}

__all__ = [
    "GoodputModel",
    "GradStats",
    "PerfParams",
    "SpeedupFunction",
    "efficiency",
    "fit_perf_params",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'shoal.perf' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
