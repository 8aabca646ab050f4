"""Open-loop load generator: send requests at a trace's arrival times, measure SLO attainment.

Open loop means each request is sent at its scheduled time whether or not earlier ones have
been answered (a closed loop would slow down with the server and hide queueing). Latency is
measured from the *scheduled* arrival, so a late send counts against the server path too.
Every request carries an absolute deadline (scheduled arrival + SLO); the server may reject it
(HTTP 503), which counts as a miss, as in the simulator.

Safety bounds: loopback URLs only, at most ``max_requests`` requests and ``duration_s`` seconds
of arrivals, and a per-request timeout.
"""

from __future__ import annotations

import asyncio
import csv
import ipaddress
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np

from shoal.serve.launch import run_fast
from shoal.serve.sim.metrics import summarize_requests
from shoal.serve.sim.workload import azure_trace_path, read_trace
from shoal.serve.wire import example_tokens, no_delay_transport
from shoal.spec.errors import SpecError

MAX_REQUESTS = 20_000
MAX_DURATION_S = 600.0


def check_loopback(url: str) -> str:
    """``url`` without a trailing slash, if its host is a loopback address; else SpecError."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SpecError(f"'{url}' is not an http URL; give e.g. http://127.0.0.1:8000",
                        field="url")
    host = parts.hostname
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise SpecError(f"host '{host}' is not a loopback address; the load generator only "
                        "targets 127.0.0.1, ::1 or localhost", field="url")
    return url.rstrip("/")


def load_arrivals(trace: str | Path, duration_s: float | None = None, rate_scale: float = 1.0,
                  max_requests: int = MAX_REQUESTS) -> np.ndarray:
    """Arrival offsets (s, from 0) from a CSV: an Azure trace (``TIMESTAMP`` column, or the
    names ``code`` / ``conv``) or any CSV with an ``arrival_s`` column. Arrivals are divided by
    ``rate_scale`` and cut at ``duration_s`` and ``max_requests``."""
    if rate_scale <= 0:
        raise SpecError(f"must be > 0 (got {rate_scale})", field="rate_scale")
    if duration_s is not None and not 0 < duration_s <= MAX_DURATION_S:
        raise SpecError(f"must be in (0, {MAX_DURATION_S:g}] seconds (got {duration_s})",
                        field="duration")
    if not 0 < max_requests <= MAX_REQUESTS:
        raise SpecError(f"must be in [1, {MAX_REQUESTS}] (got {max_requests})",
                        field="max_requests")
    path = azure_trace_path(str(trace))
    with open(path, newline="") as handle:
        header = next(csv.reader(handle), [])
    if "arrival_s" in header:
        with open(path, newline="") as handle:
            try:
                arrival = np.sort([float(row["arrival_s"]) for row in csv.DictReader(handle)])
            except ValueError as exc:
                raise SpecError(f"arrival_s must hold numbers: {exc}", source=str(path)) from exc
        if len(arrival):
            arrival = arrival - arrival[0]
    else:
        arrival = read_trace(path)[0]
    arrival = arrival / rate_scale
    limit = MAX_DURATION_S if duration_s is None else duration_s
    arrival = arrival[arrival < limit][:max_requests]
    if len(arrival) == 0:
        raise SpecError("no arrivals in the chosen window; raise --duration or --rate-scale",
                        source=str(path))
    return arrival


@dataclass
class LoadResult:
    """Per-request outcome, times in seconds from the run's start (``finish_s`` is inf for a
    rejected, failed or timed-out request)."""

    arrival_s: np.ndarray
    deadline_s: np.ndarray
    finish_s: np.ndarray
    sent_s: np.ndarray
    status: np.ndarray  # HTTP status, 0 for a transport error or timeout
    batch_size: np.ndarray  # batch the request was served in, 0 if not served
    queue_s: np.ndarray  # server-side wait before its batch started (nan if not served)
    compute_s: np.ndarray  # server-side run time of its batch (nan if not served)
    received_s: np.ndarray  # when the server got it (its clock; nan if no answer)
    summary: dict[str, float] = field(default_factory=dict)

    def as_json(self) -> dict:
        return {"summary": self.summary,
                "requests": {"arrival_s": self.arrival_s.tolist(),
                             "latency_s": [f - a if np.isfinite(f) else None
                                           for a, f in zip(self.arrival_s, self.finish_s,
                                                           strict=True)],
                             "status": self.status.tolist()}}


async def run_open_loop(url: str, arrival_s: np.ndarray, slo_s: float,
                        timeout_s: float | None = None, start_delay_s: float = 0.2) -> LoadResult:
    """Send ``POST url/infer`` at each arrival offset; return every request's outcome."""
    url = check_loopback(url)
    if slo_s <= 0:
        raise SpecError(f"must be > 0 seconds (got {slo_s})", field="slo")
    arrival = np.asarray(arrival_s, dtype=float)
    n = len(arrival)
    if n > MAX_REQUESTS:
        raise SpecError(f"{n} requests exceed the bound of {MAX_REQUESTS}", field="trace")
    timeout_s = timeout_s or max(5.0, 10.0 * slo_s)
    finish = np.full(n, np.inf)
    sent = np.full(n, np.nan)
    status = np.zeros(n, dtype=np.int64)
    batch = np.zeros(n, dtype=np.int64)
    queue = np.full(n, np.nan)
    compute = np.full(n, np.nan)
    received = np.full(n, np.nan)
    loop = asyncio.get_running_loop()
    start = loop.time() + start_delay_s
    wall_start = time.time() + start_delay_s

    async def one(client: httpx.AsyncClient, i: int) -> None:
        sent[i] = loop.time() - start
        body = {"tokens": example_tokens(i), "deadline": wall_start + arrival[i] + slo_s}
        try:
            answer = await client.post(f"{url}/infer", json=body)
        except httpx.HTTPError:
            return
        status[i] = answer.status_code
        if answer.status_code in (200, 503):
            received[i] = float(answer.json().get("received_unix", np.nan)) - wall_start
        if answer.status_code == 200:
            finish[i] = loop.time() - start
            served = answer.json()
            batch[i] = int(served.get("batch_size", 0))
            queue[i] = float(served.get("queue_s", np.nan))
            compute[i] = float(served.get("compute_s", np.nan))

    async with httpx.AsyncClient(transport=no_delay_transport(), timeout=timeout_s) as client:
        tasks = []
        for i in range(n):
            delay = start + arrival[i] - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(client, i)))
        await asyncio.gather(*tasks)
    result = LoadResult(arrival, arrival + slo_s, finish, sent, status, batch, queue, compute,
                        received)
    result.summary = summarize_load(result)
    return result


def summarize_load(result: LoadResult) -> dict[str, float]:
    """The simulator's metrics (attainment, p50/p99 of served requests) plus what only a real
    run has: HTTP outcomes, how late requests left the client, batch sizes."""
    out = summarize_requests(result.arrival_s, result.finish_s, result.deadline_s)
    lag = result.sent_s - result.arrival_s
    served = result.batch_size > 0
    out.update({
        "rejected_503": int((result.status == 503).sum()),
        "errors": int(((result.status != 200) & (result.status != 503)).sum()),
        "p99_send_lag_s": float(np.nanpercentile(lag, 99)) if len(lag) else 0.0,
        "mean_batch_size": float(result.batch_size[served].mean()) if served.any() else 0.0,
        "offered_rps": float(len(result.arrival_s) / max(result.arrival_s[-1], 1e-9)),
    })
    return out


def run_loadgen(url: str, trace: str | Path, slo_s: float, duration_s: float | None = 30.0,
                rate_scale: float = 1.0, max_requests: int = MAX_REQUESTS) -> LoadResult:
    """Load the trace's arrivals and replay them open-loop against ``url``."""
    url = check_loopback(url)
    arrival = load_arrivals(trace, duration_s, rate_scale, max_requests)
    return run_fast(run_open_loop(url, arrival, slo_s))
