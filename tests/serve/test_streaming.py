from __future__ import annotations

from shoal.serve.stream import StreamJob, StreamScaler, simulate_stream


def _step_up(t: float) -> float:
    return 100.0 if t < 60 else 400.0  # samples/s, 4x step at t=60 s


def test_rate_step_up_is_absorbed_by_more_devices():
    job = StreamJob(per_device_rate=50.0)
    scaled = simulate_stream(job, _step_up, 300.0, initial_devices=3, scaler=StreamScaler())
    fixed = simulate_stream(job, _step_up, 300.0, initial_devices=3, scaler=None)
    # Without scaling the backlog grows for ever; with it, lag stays bounded and drains.
    assert fixed.lag_s[-1] > 100.0
    assert fixed.lag_s[-1] > fixed.lag_s[len(fixed.lag_s) // 2]
    assert scaled.max_lag_s < 15.0
    assert scaled.lag_s[-1] < 0.1
    assert scaled.devices[-1] > scaled.devices[0]
    assert job.capacity(scaled.devices[-1]) >= 400.0


def test_lag_is_zero_when_capacity_suffices():
    job = StreamJob(per_device_rate=50.0)
    trace = simulate_stream(job, lambda t: 100.0, 60.0, initial_devices=3, scaler=None)
    assert trace.max_lag_s == 0.0
