from __future__ import annotations

from shoal.serve.autoscale import AutoscalingConfig
from shoal.serve.burst import BurstScenario, run_burst

FAST = AutoscalingConfig(target_ongoing_requests=1.0, min_replicas=1, max_replicas=10,
                         upscale_delay_s=0.25, downscale_delay_s=10.0)


def test_autoscaler_desired_replicas_follow_ray_serve_rule():
    cfg = AutoscalingConfig(target_ongoing_requests=2.0, min_replicas=1, max_replicas=5)
    assert cfg.desired(0) == 1
    assert cfg.desired(5) == 3
    assert cfg.desired(100) == 5


def test_burst_is_served_by_devices_lent_from_training_and_returned():
    scenario = BurstScenario()
    report = run_burst(scenario, FAST, lend=True)
    # The burst (40 req/s x 0.1 s = 4 devices of work) exceeds the 2 serving devices.
    assert report["slo_attainment"] >= 0.99, report
    assert report["peak_replicas"] > scenario.serving_devices
    assert report["max_devices_lent"] >= 1
    assert report["devices_lent_at_end"] == 0  # training grew back
    # Lost goodput is reported and bounded: devices go back after the burst, not kept.
    assert 0.0 < report["training_goodput_lost_fraction"] < 0.3
    for history in report["training_devices_over_time"].values():
        assert history[-1][1] == scenario.devices_per_training_job


def test_without_lending_the_burst_misses_slo():
    report = run_burst(BurstScenario(), FAST, lend=False)
    assert report["slo_attainment"] < 0.9
    assert report["peak_replicas"] == 2


def test_upscale_delay_costs_attainment():
    slow = AutoscalingConfig(target_ongoing_requests=1.0, max_replicas=10,
                             upscale_delay_s=20.0, downscale_delay_s=10.0)
    fast = run_burst(BurstScenario(), FAST)["slo_attainment"]
    assert run_burst(BurstScenario(), slow)["slo_attainment"] < fast
