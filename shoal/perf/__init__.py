"""Performance models: throughput, statistical efficiency and goodput of training jobs."""

from shoal.perf.efficiency import GradStats, efficiency
from shoal.perf.goodput import GoodputModel, SpeedupFunction
from shoal.perf.throughput import PerfParams, fit_perf_params

__all__ = [
    "GoodputModel",
    "GradStats",
    "PerfParams",
    "SpeedupFunction",
    "efficiency",
    "fit_perf_params",
]
