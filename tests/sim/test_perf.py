import numpy as np
import pytest

from shoal.perf import GoodputModel, GradStats, PerfParams, efficiency, fit_perf_params
from shoal.perf.throughput import predict_step_time

TRUE = PerfParams(0.02, 0.003, 0.09, 0.01, 0.03, 0.004, 1.6)


def _observations(params: PerfParams):
    configs = [(1, 1, 16), (1, 1, 32), (1, 2, 32), (1, 4, 24), (1, 4, 48), (2, 8, 32),
               (3, 12, 16), (4, 16, 32), (2, 6, 40), (1, 3, 20)]
    n, r, b = (np.array(c, dtype=float) for c in zip(*configs, strict=True))
    grad = params.alpha_c + params.beta_c * b
    step = predict_step_time(params, n, r, b)
    return n, r, b, grad, step


def test_fit_recovers_the_generating_parameters():
    n, r, b, grad, step = _observations(TRUE)
    fitted = fit_perf_params(n, r, b, grad, step)
    pred = predict_step_time(fitted, n, r, b)
    np.testing.assert_allclose(pred, step, rtol=0.02)
    assert fitted.alpha_c == pytest.approx(TRUE.alpha_c, rel=0.05)
    assert fitted.beta_c == pytest.approx(TRUE.beta_c, rel=0.05)


def test_fit_pins_unidentifiable_terms_and_keeps_inter_node_slower():
    n = np.array([1.0, 1.0])
    r = np.array([1.0, 2.0])
    b = np.array([32.0, 32.0])
    grad = np.array([0.1, 0.1])
    step = np.array([0.1, 0.13])
    fitted = fit_perf_params(n, r, b, grad, step)
    assert fitted.alpha_c == pytest.approx(0.05)  # one micro-batch size seen: half the time
    assert fitted.alpha_n >= 1.1 * fitted.alpha_r * (1 - 1e-9)
    assert fitted.beta_n >= 1.1 * fitted.beta_r * (1 - 1e-9)


def test_warm_start_reaches_the_same_fit():
    n, r, b, grad, step = _observations(TRUE)
    cold = fit_perf_params(n, r, b, grad, step)
    warm = fit_perf_params(n, r, b, grad, step, warm_start=cold)
    np.testing.assert_allclose(predict_step_time(warm, n, r, b),
                               predict_step_time(cold, n, r, b), rtol=1e-3)


def test_warm_start_from_a_fit_with_pinned_network_terms_fits_the_first_multi_node_run():
    # One replica, then the whole job across 8 nodes: the fit of the first observation pinned
    # the inter-node terms near zero, and the refit starts from it.
    n, r, b = np.array([1.0, 8.0]), np.array([1.0, 64.0]), np.array([12.0, 6.0])
    step = np.array([0.595, 1.091])
    grad = np.array([0.586, 0.356])
    single = fit_perf_params(n[:1], r[:1], b[:1], grad[:1], step[:1])
    assert single.alpha_n < 1e-6  # pinned: one replica says nothing about the network
    cold = fit_perf_params(n, r, b, grad, step)
    warm = fit_perf_params(n, r, b, grad, step, warm_start=single)
    np.testing.assert_allclose(predict_step_time(cold, n, r, b), step, rtol=0.02)
    np.testing.assert_allclose(predict_step_time(warm, n, r, b), step, rtol=0.02)


@pytest.mark.parametrize("micro_batch", [32, 1024, 16384])
def test_one_observation_is_fitted_at_any_micro_batch(micro_batch):
    # A recommender's step at 16384 samples: the per-sample term is tiny in seconds per sample.
    n, r, b = np.array([1.0]), np.array([1.0]), np.array([float(micro_batch)])
    step = np.array([0.0150])
    grad = np.array([0.0146])
    fitted = fit_perf_params(n, r, b, grad, step)
    # The model has no synchronization on one replica, so the 0.4 ms beyond compute is lost
    # (2.7%) at every micro-batch; a search in samples was 17% off at 1024 and 65% at 16384.
    np.testing.assert_allclose(predict_step_time(fitted, n, r, b), step, rtol=0.03)


def test_warm_started_refit_at_a_large_micro_batch_fits_both_observations():
    n, r, b = np.array([1.0, 1.0]), np.array([1.0, 2.0]), np.array([16384.0, 8192.0])
    step = np.array([0.0146, 0.0110])
    grad = np.array([0.0146, 0.0075])
    single = fit_perf_params(n[:1], r[:1], b[:1], grad[:1], step[:1])
    warm = fit_perf_params(n, r, b, grad, step, warm_start=single)
    np.testing.assert_allclose(predict_step_time(warm, n, r, b), step, rtol=0.02)


def test_efficiency_matches_the_noise_scale_formula():
    stats = GradStats(sqr=2.0, var=6.0)
    m0 = 128
    phi = stats.noise_scale(m0)
    assert phi == pytest.approx(384.0)
    for m in (128, 256, 1024, 4096):
        assert float(efficiency(stats, m, m0)) == pytest.approx((phi + m0) / (phi + m))


def test_goodput_optimum_is_a_valid_batch_and_beats_the_initial_one():
    model = GoodputModel(TRUE, GradStats(1.0, 50.0), init_batch_size=64, max_batch_size=4096,
                         min_atomic_bsz=8, max_atomic_bsz=128)
    choice = model.optimize(2, 8)
    assert 8 <= choice.atomic_bsz <= 128
    batch = 8 * choice.atomic_bsz * (choice.accum_steps + 1)
    assert 64 <= batch <= 4096
    initial = float(model.evaluate(2, 8, 8, 0))
    assert choice.goodput >= initial
    # Vectorized and scalar calls agree.
    many = model.optimize(np.array([1, 2, 4]), np.array([4, 8, 16]))
    assert many.goodput[1] == pytest.approx(choice.goodput)


def test_one_multi_node_size_leaves_the_inter_node_slope_pinned():
    # yolov3 on T4: 4 replicas on one node, then 12 on three. One replica count across nodes
    # fits any split of its sync time into the constant and the per-replica term; a fit that
    # put it in the slope predicted 4.6 s per step at 64 replicas on 16 nodes; the profile gives
    # 1.5 s there (1.19 s at 16 replicas).
    n, r, b = np.array([1.0, 3.0]), np.array([4.0, 12.0]), np.array([4.0, 8.0])
    step = np.array([0.457, 1.191])
    grad = step - np.array([0.122, 0.817])
    fitted = fit_perf_params(n, r, b, grad, step)
    assert fitted.beta_n < 1e-6
    np.testing.assert_allclose(predict_step_time(fitted, n, r, b), step, rtol=0.02)
    larger = predict_step_time(fitted, [4, 8, 16], [16, 32, 64], [8, 8, 8])
    np.testing.assert_allclose(larger, step[1], rtol=0.02)


def test_two_multi_node_sizes_identify_the_inter_node_slope():
    configs = [(1, 1, 16), (1, 4, 16), (2, 8, 16), (4, 16, 16)]
    n, r, b = (np.array(c, dtype=float) for c in zip(*configs, strict=True))
    grad = TRUE.alpha_c + TRUE.beta_c * b
    step = predict_step_time(TRUE, n, r, b)
    fitted = fit_perf_params(n, r, b, grad, step)
    assert fitted.beta_n == pytest.approx(TRUE.beta_n, rel=0.1)
    np.testing.assert_allclose(predict_step_time(fitted, [8], [32], [16]),
                               predict_step_time(TRUE, [8], [32], [16]), rtol=0.05)
