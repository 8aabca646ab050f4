"""The real stream source: arrivals follow the declared rate, leases lose no sample."""

from __future__ import annotations

import pytest

from shoal.serve.stream_source import StreamQueue, arrived_by
from shoal.spec.serving import RateStep


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_arrivals_are_the_integral_of_the_stepped_rate() -> None:
    steps = [RateStep(at_s=10, rate=30), RateStep(at_s=20, rate=5)]
    assert arrived_by(10.0, steps, 0.0) == 0.0
    assert arrived_by(10.0, steps, 10.0) == pytest.approx(100.0)
    assert arrived_by(10.0, steps, 15.0) == pytest.approx(250.0)
    assert arrived_by(10.0, steps, 30.0) == pytest.approx(100 + 300 + 50)


def test_leases_hand_out_arrived_samples_once_and_expired_ones_again() -> None:
    clock = Clock()
    queue = StreamQueue(10.0, [], origin=clock.now, lease_s=5.0, clock=clock)
    assert queue.take(8)[2] == 0  # nothing has arrived yet
    clock.now += 2.0  # 20 samples
    first = queue.take(8)
    second = queue.take(100)
    assert first[1:] == (0, 8) and second[1:] == (8, 12) and queue.take(5)[2] == 0
    assert queue.done(first[0]) and not queue.done(first[0])
    stats = queue.stats()
    assert (stats["arrived"], stats["processed"], stats["backlog"], stats["leased"]) == (
        20, 8, 12, 12)
    assert stats["lag_s"] == pytest.approx(1.2) and stats["input_rate"] == 10.0
    clock.now += 6.0  # the second lease expired (its worker stopped): samples 8-19 come back
    assert not queue.done(second[0])
    again = queue.take(5)
    assert again[1:] == (8, 5) and queue.take(100)[1:] == (13, 7)
    assert queue.take(100)[1:] == (20, 60)  # then the ones that arrived meanwhile


def test_a_restarted_source_resumes_after_what_was_processed() -> None:
    clock = Clock()
    queue = StreamQueue(10.0, [], origin=clock.now - 5.0, clock=clock, next_index=30,
                        processed=30)
    stats = queue.stats()
    assert (stats["arrived"], stats["processed"], stats["backlog"]) == (50, 30, 20)
    assert queue.take(100)[1:] == (30, 20)
