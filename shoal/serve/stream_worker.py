"""One device of a stream job: takes samples from the stream source, classifies them with the
tiny model, and marks them done.

``--samples-per-second`` is the device's processing rate (the job's ``stream.throughput`` for
its device type): the worker runs the model on every sample it takes and then paces itself to
that rate, so k workers process k times the declared rate, as the scheduler plans. On devices
slower than declared the pace is the model's own and the backlog shows it. Each ``/done``
carries the seconds the worker spent on the lease (take, model, pacing), from which the backend
measures what one device really processes per second. ``SHOAL_STREAM_WORKER_SPEED`` (a factor
in (0, 1], default 1) paces the worker at that fraction of the declared rate: it stands in for
a device slower than its job declared. The worker prints
``SHOAL_SERVE_PORT=0`` once its model is loaded (it listens on no port; the line says it is
working), and ends on SIGTERM after the batch in hand (an unfinished lease returns to the
queue after the source's lease time).

Run: ``python -m shoal.serve.stream_worker --source URL --samples-per-second 100``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Mapping

import httpx
import torch

from shoal.serve.launch import READY_PREFIX
from shoal.serve.tiny_model import Predictor
from shoal.serve.wire import example_tokens

IDLE_WAIT_S = 0.02  # nothing arrived: ask again after this long
SPEED_VARIABLE = "SHOAL_STREAM_WORKER_SPEED"


def emulated_speed(environ: Mapping[str, str] = os.environ) -> float:
    """The fraction of the declared rate this worker runs at (``SHOAL_STREAM_WORKER_SPEED``)."""
    raw = environ.get(SPEED_VARIABLE, "").strip()
    if not raw:
        return 1.0
    problem = SystemExit(f"{SPEED_VARIABLE}={raw!r}: expected a factor in (0, 1], e.g. 0.5 "
                         "for a device half as fast as declared")
    try:
        speed = float(raw)
    except ValueError:
        raise problem from None
    if not 0.0 < speed <= 1.0:
        raise problem
    return speed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--source", required=True, help="the stream source's URL")
    parser.add_argument("--samples-per-second", type=float, required=True)
    parser.add_argument("--batch", type=int, default=64, help="most samples taken at once")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    rate = args.samples_per_second * emulated_speed()
    torch.set_num_threads(args.threads)
    predictor = Predictor()
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    print(f"{READY_PREFIX}0", flush=True)
    # Take at most a quarter second of work at a time, so a new worker shares the backlog.
    batch = max(1, min(args.batch, int(rate / 4) or 1))
    with httpx.Client(base_url=args.source, timeout=10.0) as client:
        while not stopping:
            asked = time.monotonic()
            try:
                lease = client.post("/take", json={"max": batch}).json()
            except (httpx.HTTPError, ValueError):
                time.sleep(0.5)  # the source restarts or is gone; the backend decides
                continue
            if lease["count"] == 0:
                time.sleep(IDLE_WAIT_S)
                continue
            start = time.monotonic()
            predictor([example_tokens(i) for i in range(lease["first"],
                                                        lease["first"] + lease["count"])])
            spare = lease["count"] / rate - (time.monotonic() - start)
            if spare > 0:
                time.sleep(spare)
            try:
                client.post("/done", json={"lease": lease["lease"],
                                           "busy_s": time.monotonic() - asked})
            except httpx.HTTPError:
                time.sleep(0.5)


if __name__ == "__main__":
    main()
