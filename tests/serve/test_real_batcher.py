"""The asyncio dynamic batcher: batch formation, max wait, SLO-aware admission.

Inference is a function the test gates with a threading.Event, and admission runs on a manual
clock, so outcomes do not depend on how busy the machine is.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from shoal.serve.batcher import (
    DeadlineRejected,
    DynamicBatcher,
    LatencyEstimate,
    Served,
    profile_latency,
)


class GatedModel:
    """Records every batch; each call blocks until the test opens the gate."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, payloads: list[int]) -> list[int]:
        self.batches.append(list(payloads))
        assert self.gate.wait(10.0), "test never opened the gate"
        return [p * 10 for p in payloads]


async def _until(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.001)


def test_batches_fill_up_to_max_batch_in_arrival_order():
    async def run() -> list[Served]:
        model = GatedModel()
        model.gate.clear()
        batcher = DynamicBatcher(model, LatencyEstimate([0.01] * 4), max_batch=4, max_wait_s=0.0,
                                 admission=False)
        batcher.start()
        first = asyncio.create_task(batcher.submit(0))
        await _until(lambda: len(model.batches) == 1)
        rest = [asyncio.create_task(batcher.submit(i)) for i in range(1, 6)]
        await _until(lambda: batcher.queued == 5)
        model.gate.set()
        served = await asyncio.gather(first, *rest)
        await batcher.stop()
        assert model.batches == [[0], [1, 2, 3, 4], [5]]
        return served

    served = asyncio.run(run())
    assert [s.result for s in served] == [0, 10, 20, 30, 40, 50]
    assert [s.batch_size for s in served] == [1, 4, 4, 4, 4, 1]
    assert all(s.queue_s >= 0 and s.compute_s >= 0 for s in served)


def test_partial_batch_waits_for_max_wait_then_runs():
    async def run() -> tuple[list[Served], Served, list[list[int]]]:
        model = GatedModel()
        batcher = DynamicBatcher(model, LatencyEstimate([0.01] * 4), max_batch=4,
                                 max_wait_s=5.0, admission=False)
        batcher.start()
        tasks = [asyncio.create_task(batcher.submit(1))]
        await asyncio.sleep(0.05)
        assert model.batches == []  # one request, 5 s max wait: still waiting
        tasks += [asyncio.create_task(batcher.submit(i)) for i in (2, 3, 4)]
        full = await asyncio.wait_for(asyncio.gather(*tasks), 4.0)  # full batch: no wait
        batcher.max_wait_s = 0.1
        lone = await batcher.submit(5)
        await batcher.stop()
        return full, lone, model.batches

    full, lone, batches = asyncio.run(run())
    assert batches == [[1, 2, 3, 4], [5]]
    assert all(s.batch_size == 4 for s in full)
    assert lone.queue_s >= 0.1 - 1e-3  # a lone request is held for max_wait


class ManualClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_admission_rejects_on_arrival_what_cannot_make_its_deadline():
    async def run() -> None:
        clock = ManualClock()
        model = GatedModel()
        model.gate.clear()
        batcher = DynamicBatcher(model, LatencyEstimate([1.0, 1.5], smoothing=0.0),
                                 max_batch=2, max_wait_s=0.0, clock=clock)
        batcher.start()
        with pytest.raises(DeadlineRejected) as info:
            await batcher.submit(0, deadline=clock.now + 0.9)  # idle, but 1 s alone > 0.9 s
        assert info.value.stage == "arrival"
        running = asyncio.create_task(batcher.submit(1, deadline=clock.now + 5.0))
        await _until(lambda: len(model.batches) == 1)  # busy until now + 1.0
        with pytest.raises(DeadlineRejected):
            await batcher.submit(2, deadline=clock.now + 1.9)  # earliest finish now + 2.0
        queued = asyncio.create_task(batcher.submit(3, deadline=clock.now + 2.1))
        await _until(lambda: batcher.queued == 1)
        clock.now += 1.0
        model.gate.set()
        assert (await running).result == 10
        assert (await queued).result == 30
        assert batcher.stats.rejected_on_arrival == 2
        await batcher.stop()

    asyncio.run(run())


def test_batch_start_drops_requests_the_batch_would_make_late():
    async def run() -> None:
        clock = ManualClock()
        model = GatedModel()
        model.gate.clear()
        batcher = DynamicBatcher(model, LatencyEstimate([1.0, 1.5], smoothing=0.0),
                                 max_batch=2, max_wait_s=0.0, clock=clock)
        batcher.start()
        first = asyncio.create_task(batcher.submit(0, deadline=clock.now + 10.0))
        await _until(lambda: len(model.batches) == 1)
        roomy = asyncio.create_task(batcher.submit(1, deadline=clock.now + 2.6))
        tight = asyncio.create_task(batcher.submit(2, deadline=clock.now + 2.2))
        await _until(lambda: batcher.queued == 2)
        clock.now += 1.0  # both together would finish at +2.5: the tight one would be late
        model.gate.set()
        await first
        served = await roomy
        with pytest.raises(DeadlineRejected) as info:
            await tight
        assert info.value.stage == "batch"
        assert served.batch_size == 1
        assert model.batches == [[0], [1]]
        assert batcher.stats.rejected_at_batch == 1
        await batcher.stop()

    asyncio.run(run())


def test_latency_estimate_is_monotone_extrapolates_and_tracks_observations():
    estimate = LatencyEstimate([0.010, 0.008, 0.020], smoothing=0.5)
    assert estimate.latency_s == [0.010, 0.010, 0.020]  # noise cannot make batch 2 faster
    assert estimate(5) == pytest.approx(0.020 + 2 * 0.010)
    estimate.observe(1, 0.030)
    assert estimate(1) == pytest.approx(0.020)
    with pytest.raises(ValueError):
        LatencyEstimate([])


def test_profile_latency_times_each_batch_size():
    calls: list[int] = []

    def fake_model(payloads: list[int]) -> list[int]:
        calls.append(len(payloads))
        return payloads

    ticks = iter(range(10_000))
    table = profile_latency(fake_model, lambda i: i, [1, 3], repeats=3, warmup=1,
                            clock=lambda: float(next(ticks)))
    assert calls == [1] * 4 + [3] * 4
    assert table == {1: 1.0, 3: 1.0}
