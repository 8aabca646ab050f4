"""The input of a stream job: samples arriving at the job's declared rate, handed out as work.

Sample ``i`` arrives when the integral of the job's rate (``input_rate`` and its ``steps``,
measured from ``--origin``, the job's submission) reaches ``i + 1``, whether or not a worker is
there to take it: the backlog is what has arrived and is not processed yet, and the lag is the
backlog in seconds of input (``backlog / rate``), as in the simulator's fluid model.

Workers pull: ``POST /take {"max": n}`` leases the oldest unleased samples (``first``,
``count``; count 0 when none has arrived), ``POST /done {"lease": id}`` marks them processed.
A lease not done within ``--lease`` seconds (its worker stopped or died) goes back to the queue,
so no sample is lost to a resize. A source started again after a crash takes ``--processed``,
the count its job last read: the samples before it count as done, the rest are handed out again
(at least once). ``GET /stats`` has ``arrived``, ``processed``, ``backlog``,
``input_rate`` (the rate now), ``lag_s``, ``leased``, and ``timed`` / ``busy_s``: the samples
done by workers that reported their time on them (``/done {"lease": id, "busy_s": s}``) and
those seconds, from which the backend measures one device's speed.

Run: ``python -m shoal.serve.stream_source --rate 200 [--step 60:400 ...] --origin UNIX_S``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fastapi import FastAPI
from pydantic import BaseModel, Field

from shoal.serve.launch import serve_app
from shoal.spec.serving import RateStep, rate_at


def arrived_by(base: float, steps: Sequence[RateStep], t: float) -> float:
    """Samples arrived ``t`` seconds after the origin (the integral of the rate)."""
    total, at, rate = 0.0, 0.0, base
    for step in steps:
        if step.at_s >= t:
            break
        total += rate * (step.at_s - at)
        at, rate = step.at_s, step.rate
    return total + rate * max(0.0, t - at)


@dataclass
class StreamQueue:
    """Arrivals, leases and completions of one stream (no I/O: the app's state)."""

    base_rate: float
    steps: list[RateStep]
    origin: float
    lease_s: float = 10.0
    clock: Callable[[], float] = time.time
    next_index: int = 0  # the first sample never handed out
    processed: int = 0
    # Samples done by workers that said how long they took, and those seconds: what one
    # device processes per second while it has work (its pacing included), whatever the input.
    timed: int = 0
    busy_s: float = 0.0
    returned: list[tuple[int, int]] = field(default_factory=list)  # (first, count) to redo
    leases: dict[int, tuple[int, int, float]] = field(default_factory=dict)  # id: first, n, due
    _ids: itertools.count = field(default_factory=itertools.count)

    def arrived(self) -> int:
        return math.floor(arrived_by(self.base_rate, self.steps, self.clock() - self.origin)
                          + 1e-9)

    def take(self, most: int) -> tuple[int, int, int]:
        """Lease up to ``most`` samples: (lease id, first index, count); count 0 if none."""
        self._expire()
        now = self.clock()
        if self.returned:
            first, count = self.returned.pop(0)
            if count > most:
                self.returned.insert(0, (first + most, count - most))
                count = most
        else:
            first = self.next_index
            count = max(0, min(most, self.arrived() - first))
            self.next_index += count
        if count == 0:
            return -1, first, 0
        lease = next(self._ids)
        self.leases[lease] = (first, count, now + self.lease_s)
        return lease, first, count

    def done(self, lease: int, busy_s: float | None = None) -> bool:
        """Mark a lease processed (``busy_s``: the seconds its worker spent on it); False when
        it was unknown or had expired (redone)."""
        self._expire()
        held = self.leases.pop(lease, None)
        if held is None:
            return False
        self.processed += held[1]
        if busy_s is not None:
            self.timed += held[1]
            self.busy_s += busy_s
        return True

    def _expire(self) -> None:
        now = self.clock()
        for lease, (first, count, due) in list(self.leases.items()):
            if due < now:
                del self.leases[lease]
                self.returned.append((first, count))
        self.returned.sort()

    def stats(self) -> dict[str, float | int]:
        self._expire()
        arrived = self.arrived()
        rate = rate_at(self.base_rate, self.steps, self.clock() - self.origin)
        backlog = arrived - self.processed
        return {"arrived": arrived, "processed": self.processed, "backlog": backlog,
                "input_rate": rate, "lag_s": backlog / rate if rate > 0 else 0.0,
                "leased": sum(n for _, n, _ in self.leases.values()),
                "timed": self.timed, "busy_s": self.busy_s}


class TakeRequest(BaseModel):
    max: int = Field(ge=1, le=100_000)


class DoneRequest(BaseModel):
    lease: int
    busy_s: float | None = Field(default=None, ge=0)  # the worker's time on the lease


def create_app(queue: StreamQueue) -> FastAPI:
    app = FastAPI(title="shoal stream source")

    @app.post("/take")
    def take(request: TakeRequest) -> dict[str, int]:
        lease, first, count = queue.take(request.max)
        return {"lease": lease, "first": first, "count": count}

    @app.post("/done")
    def done(request: DoneRequest) -> dict[str, bool]:
        return {"ok": queue.done(request.lease, request.busy_s)}

    @app.get("/stats")
    def stats() -> dict[str, float | int]:
        return queue.stats()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


def _step(text: str) -> RateStep:
    at, _, rate = text.partition(":")
    try:
        return RateStep(at_s=float(at), rate=float(rate))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not AT_S:RATE, e.g. 60:400") from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--rate", type=float, required=True, help="samples/s at the origin")
    parser.add_argument("--step", type=_step, action="append", default=[],
                        help="AT_S:RATE, the rate from AT_S seconds after the origin on")
    parser.add_argument("--origin", type=float, default=None,
                        help="unix seconds the stream started (default: now)")
    parser.add_argument("--lease", type=float, default=10.0,
                        help="seconds a worker has to finish what it took")
    parser.add_argument("--processed", type=int, default=0,
                        help="samples an earlier source of this stream had processed")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    queue = StreamQueue(args.rate, sorted(args.step, key=lambda s: s.at_s),
                        time.time() if args.origin is None else args.origin, args.lease,
                        next_index=args.processed, processed=args.processed)
    serve_app(create_app(queue), args.host, args.port)


if __name__ == "__main__":
    main()
