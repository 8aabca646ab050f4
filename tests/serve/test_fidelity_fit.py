"""The batch-table fit the serving fidelity check feeds the simulator, on synthetic runs."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.serve.fidelity import fit_batch_latency
from shoal.serve.loadgen import LoadResult


def _run(batches: dict[int, list[float]]) -> LoadResult:
    """A load run whose requests were served in ``batches``: size -> run time of each batch."""
    sizes, compute = [], []
    for size, times in batches.items():
        for t in times:
            sizes += [size] * size
            compute += [t] * size
    n = len(sizes)
    zeros = np.zeros(n)
    return LoadResult(zeros, zeros + 1.0, zeros + 0.5, zeros, np.full(n, 200),
                      np.asarray(sizes), zeros, np.asarray(compute, dtype=float), zeros)


def test_line_through_the_observed_sizes():
    run = _run({1: [0.003] * 10, 2: [0.005] * 10, 3: [0.007] * 5})
    table, measured = fit_batch_latency(run, 8, fallback=[1.0] * 8)
    assert table == pytest.approx([0.003 + 0.002 * i for i in range(8)], rel=1e-6)
    assert measured == pytest.approx({1: 0.003, 2: 0.005, 3: 0.007})


def test_sizes_seen_in_one_or_two_batches_do_not_set_the_slope():
    # One slow batch of 6 would otherwise pull the line to ~9 ms per request.
    run = _run({1: [0.003] * 20, 2: [0.004] * 12, 6: [0.060]})
    table, measured = fit_batch_latency(run, 8, fallback=[1.0] * 8)
    assert table == pytest.approx([0.003 + 0.001 * i for i in range(8)], rel=1e-6)
    assert measured[6] == pytest.approx(0.060)


def test_one_size_scales_the_fallback_and_none_returns_it():
    fallback = [0.002 * (i + 1) for i in range(4)]
    table, _ = fit_batch_latency(_run({2: [0.008] * 5}), 4, fallback)
    assert table == pytest.approx([0.004, 0.008, 0.012, 0.016])
    empty = _run({})
    assert fit_batch_latency(empty, 4, fallback)[0] == pytest.approx(fallback)
