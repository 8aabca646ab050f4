from __future__ import annotations

import numpy as np
import pytest

from shoal.serve.sim.workload import gamma_arrivals, read_trace, trace_workload
from shoal.spec.errors import SpecError


def test_azure_code_trace_is_read_in_full():
    arrival, prompt, output = read_trace("code")
    assert len(arrival) == 8819
    assert arrival[0] == 0.0 and np.all(np.diff(arrival) >= 0)
    assert 3400 < arrival[-1] < 3500  # one hour of requests
    assert prompt.min() >= 1 and output.min() >= 1


@pytest.mark.parametrize("cv", [0.5, 1.0, 3.0])
def test_gamma_arrivals_have_requested_rate_and_cv(cv):
    times = gamma_arrivals(20.0, cv, 2000.0, np.random.default_rng(0))
    gaps = np.diff(times)
    assert abs(len(times) / 2000.0 - 20.0) / 20.0 < 0.05 * max(1.0, cv)
    assert abs(gaps.std() / gaps.mean() - cv) / cv < 0.08


def test_trace_workload_rate_scale_and_cv_refit():
    rng = np.random.default_rng(0)
    base = trace_workload("code", 8, rng, rate_scale=1.0)
    fast = trace_workload("code", 8, np.random.default_rng(0), rate_scale=10.0)
    assert len(fast) == len(base)
    assert abs(fast.duration_s * 10 - base.duration_s) < 1e-6
    assert np.bincount(base.model)[0] > np.bincount(base.model)[7]  # skewed popularity
    refit = trace_workload("code", 8, np.random.default_rng(1), rate_scale=10.0, cv=1.0)
    assert len(refit) == len(base)  # per-window counts are kept
    gaps = np.diff(base.arrival_s)
    refit_gaps = np.diff(refit.arrival_s)
    assert refit_gaps.std() / refit_gaps.mean() < gaps.std() / gaps.mean()


def test_bad_trace_name_names_the_field():
    with pytest.raises(SpecError, match="field 'trace'"):
        read_trace("no-such-trace")
