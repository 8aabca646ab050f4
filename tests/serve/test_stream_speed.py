"""Stream jobs are sized by what one device really processes: workers report their busy time,
the backend measures samples per busy second per device type, and the service demand uses it in
place of the declared throughput."""

from __future__ import annotations

import pytest

from shoal.backends.local.stream_window import MIN_BUSY_S, SourceSample, StreamWindow
from shoal.core.demand import ServiceDemand
from shoal.core.types import Allocation, JobLimits, JobState, JobStatus, JobView, ModelHints
from shoal.serve.stream_source import StreamQueue
from shoal.serve.stream_worker import SPEED_VARIABLE, emulated_speed
from shoal.spec import JobSpec, parse_job


def _stream(**stream: object) -> JobSpec:
    fields = {"input_rate": 40, "throughput": {"cpu": 80, "t4": 400}, "max_lag_s": 5,
              "max_replicas": 4, **stream}
    return parse_job({"name": "clicks", "kind": "stream", "stream": fields})


def _view(spec: JobSpec, allocation: Allocation | None) -> JobView:
    return JobView(spec.name, spec, JobState.RUNNING if allocation else JobState.PENDING,
                   0.0, 0.0, 0.0, 0, allocation, ModelHints(), JobLimits(1, 1, 1, 1, 16))


def test_the_source_counts_the_samples_and_seconds_workers_report() -> None:
    now = [100.0]
    queue = StreamQueue(10.0, [], origin=now[0], clock=lambda: now[0])
    now[0] += 3.0  # 30 samples arrived
    a, b = queue.take(10), queue.take(10)
    assert queue.done(a[0], busy_s=0.5) and queue.done(b[0])  # the second says no time
    stats = queue.stats()
    assert (stats["processed"], stats["timed"], stats["busy_s"]) == (20, 10, 0.5)
    assert not queue.done(a[0], busy_s=9.0)  # a lease done twice counts once
    assert queue.stats()["busy_s"] == 0.5


def test_the_window_measures_input_rate_and_one_devices_speed_of_the_latest_type() -> None:
    window = StreamWindow(span_s=10.0)
    window.add(SourceSample(0.0, 0, 0, 0.0, "cpu"))
    assert window.input_rate() is None and window.device_speed() is None
    window.add(SourceSample(1.0, 40, 30, 1.0, "cpu"))
    assert window.input_rate() == 40.0
    assert window.device_speed() is None  # 1 busy second is not enough to go by
    window.add(SourceSample(4.0, 160, 126, 4.0, "cpu"))  # two workers, 32 samples/s each
    assert window.device_speed() == ("cpu", pytest.approx(126 / 4.0))
    # Moved to t4: the cpu readings say nothing about it.
    window.add(SourceSample(5.0, 200, 200, 4.5, "t4"))
    window.add(SourceSample(6.0, 240, 300, 4.5 + MIN_BUSY_S / 2, "t4"))
    assert window.device_speed() is None
    window.add(SourceSample(7.0, 280, 500, 4.5 + MIN_BUSY_S, "t4"))
    assert window.device_speed() == ("t4", pytest.approx(300 / MIN_BUSY_S))
    # A new source counts from zero again: a new window, not negative rates.
    window.add(SourceSample(8.0, 320, 0, 0.0, "t4"))
    assert len(window.samples) == 1 and window.device_speed() is None
    # Readings older than the span leave it.
    for t in range(9, 30):
        window.add(SourceSample(float(t), 320 + 40 * (t - 8), 0, 0.0, "t4"))
    assert window.samples[0].time >= 29.0 - 10.0 - 1.0
    assert window.input_rate() == pytest.approx(40.0)


def test_demand_uses_the_measured_speed_of_the_type_it_sizes() -> None:
    spec = _stream()
    view = _view(spec, Allocation("cpu", (0,)))
    demand = ServiceDemand()
    # Declared: one cpu device covers 1.2 x 40 = 48 samples/s.
    assert demand.demand(view, "cpu", now=10.0) == 1
    # Measured at 32 samples/s a device: two are needed; t4 keeps its declared speed.
    demand.observe(spec, JobStatus("clicks", extra={
        "input_rate": 40.0, "backlog": 0.0, "device_speed": 32.0, "device_type": "cpu"}))
    assert demand.demand(view, "cpu", now=10.0) == 2
    assert demand.demand(view, "t4", now=10.0) == 1
    # A later status without a speed (no busy time yet) keeps the last one measured.
    demand.observe(spec, JobStatus("clicks", extra={"input_rate": 40.0}))
    assert demand.demand(view, "cpu", now=10.0) == 2


def test_an_emulated_speed_outside_zero_to_one_is_refused_naming_the_variable() -> None:
    assert emulated_speed({}) == 1.0
    assert emulated_speed({SPEED_VARIABLE: "0.4"}) == 0.4
    for bad in ("0", "1.5", "fast"):
        with pytest.raises(SystemExit, match=SPEED_VARIABLE):
            emulated_speed({SPEED_VARIABLE: bad})


def test_stream_workers_on_ray_nodes_get_the_emulated_speed_of_the_service() -> None:
    from shoal.backends.ray.services import stream_worker_environment

    assert stream_worker_environment({"PATH": "/bin"}) == {}
    assert stream_worker_environment({SPEED_VARIABLE: "0.4", "PATH": "/bin"}) == {
        SPEED_VARIABLE: "0.4"}
