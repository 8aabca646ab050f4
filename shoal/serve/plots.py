"""Matplotlib figures for serving results."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np


def plot_policies(results: Mapping[str, dict], out: str | Path) -> None:
    """SLO attainment per policy and the latency CDF of served requests."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    names = list(results)
    left.bar(names, [100 * results[n]["summary"]["slo_attainment"] for n in names])
    left.set_ylabel("SLO attainment (%)")
    left.set_ylim(0, 100)
    for name in names:
        latency = np.sort(np.asarray(results[name].get("latency_s") or []))
        if len(latency):
            right.plot(latency, np.arange(1, len(latency) + 1) / len(latency), label=name)
    right.set_xscale("log")
    right.set_xlabel("latency (s)")
    right.set_ylabel("CDF of served requests")
    right.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_sweep(x: Sequence[float], series: Mapping[str, Sequence[float]], xlabel: str,
               out: str | Path, title: str = "") -> None:
    """Attainment (%) of each policy against one swept parameter."""
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for name, values in series.items():
        ax.plot(x, [100 * v for v in values], marker="o", label=name)
    ax.axhline(99, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("SLO attainment (%)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
