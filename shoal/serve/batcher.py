"""Asyncio dynamic batcher with SLO-aware admission, the real twin of the simulator's engine.

Requests queue in arrival order; one worker runs batches, one at a time, in a dedicated thread
(so the event loop keeps accepting requests while the model computes). The rules are the ones
:mod:`shoal.serve.sim.engine` simulates, so a measured latency table predicts this batcher:

* a batch smaller than ``max_batch`` waits until its oldest request has waited ``max_wait_s``;
* admission on arrival: reject when the request could not finish by its deadline even if it were
  served next (``max(now, busy_until) + latency(1) > deadline``);
* at batch start: drop queued heads that would miss even alone, then drop every request of the
  batch whose deadline the batch's latency would miss (and re-time the smaller batch).

The latency per batch size is an estimate seeded by profiling at start-up and kept current with
an exponentially weighted average of the batches actually run.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

Clock = Callable[[], float]


class DeadlineRejected(Exception):
    """The request cannot meet its deadline; ``stage`` is 'arrival' or 'batch'."""

    def __init__(self, stage: str, expected_finish: float, deadline: float):
        self.stage = stage
        self.expected_finish = expected_finish
        self.deadline = deadline
        super().__init__(f"rejected at {stage}: expected finish {expected_finish:.4f} is after "
                         f"the deadline {deadline:.4f}")


class LatencyEstimate:
    """Seconds to run a batch of each size 1..max_batch (linear beyond the last measured)."""

    def __init__(self, latency_s: Sequence[float], smoothing: float = 0.1):
        if not latency_s or min(latency_s) <= 0:
            raise ValueError("latency_s needs one positive entry per batch size 1..max_batch")
        # A larger batch never runs faster; a short profile on a busy machine can say otherwise.
        self.latency_s = list(itertools.accumulate((float(x) for x in latency_s), max))
        self.smoothing = smoothing

    def __call__(self, size: int) -> float:
        table = self.latency_s
        if size <= len(table):
            return table[size - 1]
        slope = table[-1] - table[-2] if len(table) > 1 else table[-1]
        return table[-1] + (size - len(table)) * max(slope, 0.0)

    def observe(self, size: int, seconds: float) -> None:
        if size <= len(self.latency_s):
            old = self.latency_s[size - 1]
            self.latency_s[size - 1] = old + self.smoothing * (seconds - old)


@dataclass
class _Pending:
    payload: Any
    arrival: float
    deadline: float
    future: asyncio.Future


@dataclass(frozen=True)
class Served:
    """A request's result and where its time went (all in seconds)."""

    result: Any
    batch_size: int
    queue_s: float
    compute_s: float


@dataclass
class BatcherStats:
    served: int = 0
    rejected_on_arrival: int = 0
    rejected_at_batch: int = 0
    batches: dict[int, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"served": self.served, "rejected_on_arrival": self.rejected_on_arrival,
                "rejected_at_batch": self.rejected_at_batch,
                "batches_by_size": {str(k): v for k, v in sorted(self.batches.items())}}


class DynamicBatcher:
    """Batches ``submit``-ted payloads and runs ``infer(list of payloads) -> list of results``.

    Start it inside a running event loop with :meth:`start`; :meth:`stop` cancels the worker.
    """

    def __init__(self, infer: Callable[[list[Any]], Sequence[Any]], latency: LatencyEstimate,
                 max_batch: int = 8, max_wait_s: float = 0.005, admission: bool = True,
                 clock: Clock = time.time):
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        if max_wait_s < 0:
            raise ValueError("max_wait_s must be >= 0")
        self.infer = infer
        self.latency = latency
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.admission = admission
        self.clock = clock
        self.stats = BatcherStats()
        self._queue: deque[_Pending] = deque()
        self._wakeup = asyncio.Event()
        self._busy_until = 0.0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shoal-infer")
        self._worker: asyncio.Task | None = None

    def start(self) -> None:
        self._worker = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        for pending in self._queue:
            pending.future.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def run_exclusive(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the inference thread (e.g. profiling), serialized with the batches."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    @property
    def queued(self) -> int:
        return len(self._queue)

    async def submit(self, payload: Any, deadline: float = float("inf")) -> Served:
        """Queue one request; raises :class:`DeadlineRejected` if it cannot make ``deadline``."""
        now = self.clock()
        if self.admission:
            finish = max(now, self._busy_until) + self.latency(1)
            if finish > deadline:
                self.stats.rejected_on_arrival += 1
                raise DeadlineRejected("arrival", finish, deadline)
        future = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(payload, now, deadline, future))
        self._wakeup.set()
        return await future

    async def _run(self) -> None:
        queue = self._queue
        while True:
            if not queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            now = self.clock()
            if self.admission:
                while queue and now + self.latency(1) > queue[0].deadline:
                    self._reject(queue.popleft(), now + self.latency(1))
                if not queue:
                    continue
            oldest = queue[0].arrival
            if len(queue) < self.max_batch and now < oldest + self.max_wait_s:
                self._wakeup.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), oldest + self.max_wait_s - now)
                continue
            batch = [queue.popleft() for _ in range(min(self.max_batch, len(queue)))]
            if self.admission:
                batch = self._drop_late(batch, now)
                if not batch:
                    continue
            await self._execute(batch, now)

    def _drop_late(self, batch: list[_Pending], now: float) -> list[_Pending]:
        while batch:
            finish = now + self.latency(len(batch))
            keep = [p for p in batch if p.deadline >= finish]
            if len(keep) == len(batch):
                return batch
            for p in batch:
                if p.deadline < finish:
                    self._reject(p, finish)
            batch = keep
        return batch

    def _reject(self, pending: _Pending, finish: float) -> None:
        self.stats.rejected_at_batch += 1
        if not pending.future.done():
            pending.future.set_exception(DeadlineRejected("batch", finish, pending.deadline))

    async def _execute(self, batch: list[_Pending], now: float) -> None:
        size = len(batch)
        self._busy_until = now + self.latency(size)
        started = self.clock()
        try:
            results = await self.run_exclusive(lambda: self.infer([p.payload for p in batch]))
        except Exception as exc:  # the model failed: every request of the batch gets the error
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(exc)
            return
        finally:
            self._busy_until = 0.0
        compute = self.clock() - started
        self.latency.observe(size, compute)
        self.stats.served += size
        self.stats.batches[size] = self.stats.batches.get(size, 0) + 1
        for p, result in zip(batch, results, strict=True):
            if not p.future.done():
                p.future.set_result(Served(result, size, started - p.arrival, compute))


def profile_latency(infer: Callable[[list[Any]], Sequence[Any]],
                    make_payload: Callable[[int], Any], batch_sizes: Sequence[int],
                    repeats: int = 10, warmup: int = 2,
                    clock: Clock = time.perf_counter) -> dict[int, float]:
    """Median seconds of ``infer`` per batch size (batches of ``make_payload(i)`` payloads)."""
    out: dict[int, float] = {}
    for size in batch_sizes:
        payloads = [make_payload(i) for i in range(size)]
        samples = []
        for k in range(warmup + repeats):
            started = clock()
            infer(payloads)
            if k >= warmup:
                samples.append(clock() - started)
        out[size] = statistics.median(samples)
    return out
