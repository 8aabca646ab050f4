from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from shoal.perf.efficiency import GradStats
from shoal.train.gns import NoiseScaleEstimator
from shoal.train.scaling import lr_factor, resolve_rule


def test_estimator_recovers_known_gradient_norm_and_variance() -> None:
    """Pieces are means of b noisy per-sample gradients around a known G."""
    rng = np.random.default_rng(0)
    dim, pieces, b = 400, 4, 8
    true_g = rng.normal(0, 0.5, dim)  # |G|^2 about 100
    sigma = 1.5  # per-coordinate sample noise: tr(Sigma) = dim * sigma^2 = 900
    est = NoiseScaleEstimator(smoothing=0.99)
    for _ in range(400):
        samples = true_g + sigma * rng.normal(size=(pieces * b, dim))
        piece_means = samples.reshape(pieces, b, dim).mean(axis=1)
        total = samples.mean(axis=0)
        est.update(
            float(np.mean((piece_means**2).sum(axis=1))), 1 / b, float((total**2).sum()),
            pieces * b,
        )
    stats = est.stats(init_batch_size=16)
    assert stats is not None
    assert stats.sqr == pytest.approx(float(true_g @ true_g), rel=0.15)
    assert stats.var * 16 == pytest.approx(dim * sigma**2, rel=0.1)


def test_estimator_ignores_steps_without_spread_and_roundtrips() -> None:
    est = NoiseScaleEstimator()
    assert est.stats(8) is None
    assert not est.update(1.0, 1 / 32, 1.0, 32)  # one piece covering the batch: no information
    assert est.update(3.0, 1 / 4, 1.5, 8)
    copy = NoiseScaleEstimator()
    copy.load_state_dict(est.state_dict())
    assert copy.stats(8) == est.stats(8)


def test_lr_rules() -> None:
    model = torch.nn.Linear(2, 2)
    assert resolve_rule("auto", torch.optim.SGD(model.parameters(), lr=0.1)) == "adascale"
    assert resolve_rule("auto", torch.optim.AdamW(model.parameters())) == "sqrt"
    assert resolve_rule("auto", torch.optim.Adagrad(model.parameters())) == "none"
    with pytest.raises(ValueError, match="lr_scaling"):
        resolve_rule("cubic", torch.optim.SGD(model.parameters(), lr=0.1))
    assert lr_factor("linear", 4.0, None) == 4.0
    assert lr_factor("sqrt", 4.0, None) == 2.0
    assert lr_factor("none", 4.0, None) == 1.0
    assert lr_factor("adascale", 4.0, None) == 1.0  # nothing measured yet
    # Pure noise: AdaScale's gain equals the scale; no noise: gain 1.
    assert lr_factor("adascale", 4.0, GradStats(sqr=1e-12, var=1.0)) == pytest.approx(4.0)
    assert lr_factor("adascale", 4.0, GradStats(sqr=1.0, var=0.0)) == pytest.approx(1.0)
    mid = lr_factor("adascale", 4.0, GradStats(sqr=1.0, var=1.0))
    assert mid == pytest.approx(2 / (0.25 + 1)) and 1 < mid < 4 and not math.isnan(mid)
