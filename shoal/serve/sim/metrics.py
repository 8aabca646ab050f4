"""Summary metrics of a simulation (and of real runs, from the same per-request arrays)."""

from __future__ import annotations

import numpy as np


def summarize_requests(arrival_s: np.ndarray, finish_s: np.ndarray,
                       deadline_s: np.ndarray) -> dict[str, float]:
    """SLO attainment over all requests (rejected ones count as misses); latency percentiles over
    the served ones; throughput = served requests per second of the arrival span."""
    n = len(arrival_s)
    served = np.isfinite(finish_s)
    latency = (finish_s - arrival_s)[served]
    good = served & (finish_s <= deadline_s + 1e-9)
    span = float(arrival_s[-1] - arrival_s[0]) if n > 1 else 0.0
    return {
        "requests": int(n),
        "served": int(served.sum()),
        "late": int((served & ~good).sum()),  # served after the deadline
        "rejected": int(n - served.sum()),
        "slo_attainment": float(good.mean()) if n else 1.0,
        "mean_latency_s": float(latency.mean()) if len(latency) else float("nan"),
        "p50_latency_s": float(np.percentile(latency, 50)) if len(latency) else float("nan"),
        "p99_latency_s": float(np.percentile(latency, 99)) if len(latency) else float("nan"),
        "throughput_rps": float(served.sum() / span) if span > 0 else float("nan"),
        "goodput_rps": float(good.sum() / span) if span > 0 else float("nan"),
    }


def attainment_by_model(model: np.ndarray, finish_s: np.ndarray,
                        deadline_s: np.ndarray) -> dict[int, float]:
    good = np.isfinite(finish_s) & (finish_s <= deadline_s + 1e-9)
    return {int(m): float(good[model == m].mean()) for m in np.unique(model)}
