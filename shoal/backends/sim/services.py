"""Serve and stream jobs in the simulator, on the request-level serving simulator.

Between two scheduling rounds a service holds a fixed allocation, so each interval is
simulated on its own:

* **serve**: the requests arriving in the interval (replayed from the job's trace or drawn from
  its Gamma process) go through :class:`shoal.serve.sim.engine.Engine` with one single-device
  group per replica (dynamic batching up to the job's batch limit, SLO-aware admission, the
  job's latency table for the allocated device type). A replica added by a resize is ready
  ``cold_start_s`` after the change. Requests arriving while the job holds no devices are
  missed. Simplification: queues start empty in every interval (requests queued at its end
  are still served, by the replicas of that interval).
* **stream**: the fluid model of :mod:`shoal.serve.stream`, stepped every second: the backlog
  grows with the input rate and shrinks with the capacity ``throughput x k ** scaling`` of the
  ``k`` devices working; added devices start working ``startup_s`` after the change. Lag is
  the backlog in seconds of input.

Each job reports what a real service measures: the arrival (input) rate over the last
interval, SLO attainment or lag and backlog; the scheduler core sizes it from those.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from shoal.core.demand import service_device_types
from shoal.core.types import Allocation, Change, ClusterState, JobLimits, JobStatus
from shoal.serve.sim.engine import BatchingConfig, Engine, SimGroup
from shoal.serve.sim.metrics import summarize_requests
from shoal.serve.sim.workload import Workload, azure_trace_path, gamma_arrivals
from shoal.spec.errors import SpecError
from shoal.spec.job import JobSpec
from shoal.spec.serving import ArrivalSpec, ServeSpec, StreamSpec

STREAM_STEP_S = 1.0


def service_limits(spec: JobSpec) -> JobLimits:
    section = spec.serve if spec.kind == "serve" else spec.stream
    assert section is not None
    return JobLimits(init_batch_size=1, max_batch_size=1, min_local_bsz=1, max_local_bsz=1,
                     max_replicas=section.max_replicas)


# ----- arrivals -----
def _parse_time(text: str) -> float:
    """Seconds from a number or an ISO timestamp (Azure traces carry 7 fractional digits)."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    if "." in text:
        head, frac = text.split(".", 1)
        text = f"{head}.{frac[:6]}"
    return datetime.fromisoformat(text).timestamp()


def trace_arrivals(arrival: ArrivalSpec, model: str) -> np.ndarray:
    """Arrival offsets (s, from the first kept request) of a trace, divided by rate_scale."""
    assert arrival.trace is not None
    try:
        path = azure_trace_path(arrival.trace)
    except SpecError as exc:
        raise SpecError(str(exc).split("': ", 1)[-1], field="serve.arrival.trace") from None
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        column = arrival.column or next((c for c in ("arrival_s", "TIMESTAMP") if c in header),
                                        None)
        if column is None or column not in header:
            raise SpecError(f"{path} has no column {arrival.column or 'arrival_s or TIMESTAMP'}"
                            f" (columns: {header}); name the arrival column in "
                            "serve.arrival.column", field="serve.arrival.column")
        if arrival.model_column is not None and arrival.model_column not in header:
            raise SpecError(f"{path} has no column '{arrival.model_column}' (columns: "
                            f"{header})", field="serve.arrival.model_column")
        times = []
        for line, row in enumerate(reader, start=2):
            if arrival.model_column is not None and row[arrival.model_column].strip() != model:
                continue
            try:
                times.append(_parse_time(row[column]))
            except (TypeError, ValueError):
                raise SpecError(f"{path}:{line}: '{row[column]}' in column {column} is not a "
                                "time (seconds or ISO timestamp)",
                                field="serve.arrival.column") from None
    if not times:
        raise SpecError(f"{path} has no requests" + (
            f" for model '{model}' in column {arrival.model_column}" if arrival.model_column
            else ""), field="serve.arrival.trace")
    out = np.sort(np.asarray(times, dtype=float))
    return (out - out[0]) / arrival.rate_scale


def gamma_process(arrival: ArrivalSpec, duration_s: float) -> np.ndarray:
    """Gamma renewal arrivals in [0, duration_s), the rate changing at the declared steps."""
    assert arrival.rate is not None
    rng = np.random.default_rng(arrival.seed)
    bounds = [0.0, *(s.at_s for s in arrival.steps if s.at_s < duration_s), duration_s]
    rates = [arrival.rate, *(s.rate for s in arrival.steps if s.at_s < duration_s)]
    parts = [start + gamma_arrivals(rate, arrival.cv, end - start, rng)
             for start, end, rate in zip(bounds[:-1], bounds[1:], rates, strict=True)
             if end > start]
    return np.concatenate(parts) if parts else np.zeros(0)


# ----- jobs -----
@dataclass
class _Service:
    name: str
    submit_time: float
    end_time: float
    allocation: Allocation | None = None
    device_seconds: float = 0.0
    finished_at: float | None = None
    last: dict[str, Any] = field(default_factory=dict)  # measurements of the last interval
    history: list[dict[str, Any]] = field(default_factory=list)

    def _window(self, now: float, seconds: float) -> tuple[float, float] | None:
        if self.finished_at is not None:
            return None
        start = max(now, self.submit_time)
        end = min(now + seconds, self.end_time)
        if end <= start:
            return None
        return start, end

    def _account(self, start: float, end: float) -> None:
        if self.allocation is not None:
            self.device_seconds += (end - start) * self.allocation.num_replicas
        if end >= self.end_time:
            self.finished_at = self.end_time

    def _usage(self) -> dict[str, float]:
        """Devices: the most held in any interval, and device-seconds."""
        return {"peak_devices": max((h["replicas"] for h in self.history), default=0),
                "device_seconds": self.device_seconds}

    def status(self) -> JobStatus:
        return JobStatus(self.name, device_seconds=self.device_seconds,
                         finished_at=self.finished_at,
                         extra={"running": self.allocation is not None, **self.last})


@dataclass
class SimServe(_Service):
    spec: ServeSpec | None = None
    arrivals: np.ndarray = field(default_factory=lambda: np.zeros(0))  # absolute times
    ready_at: list[float] = field(default_factory=list)  # per replica
    requests: int = 0
    good: int = 0
    latencies: list[float] = field(default_factory=list)  # of served requests, seconds

    def reallocate(self, allocation: Allocation | None, now: float) -> None:
        assert self.spec is not None
        old = self.allocation
        ready = now + self.spec.cold_start_s
        if allocation is None:
            self.ready_at = []
        elif old is None or old.device_type != allocation.device_type:
            self.ready_at = [ready] * allocation.num_replicas
        else:
            keep = self.ready_at[: allocation.num_replicas]
            self.ready_at = keep + [ready] * (allocation.num_replicas - len(keep))
        self.allocation = allocation

    def advance(self, now: float, seconds: float) -> None:
        window = self._window(now, seconds)
        if window is None:
            return
        start, end = window
        lo, hi = np.searchsorted(self.arrivals, [start, end])
        arrival = self.arrivals[lo:hi]
        good = 0
        summary: dict[str, float] = {}
        if len(arrival) and self.allocation is not None:
            summary = self._simulate(arrival, start)
            good = round(summary["slo_attainment"] * len(arrival))
        self.requests += len(arrival)
        self.good += good
        self.last = {
            "arrival_rate": len(arrival) / (end - start),
            "requests": len(arrival),
            "slo_attainment": good / len(arrival) if len(arrival) else 1.0,
            "p99_latency_s": summary.get("p99_latency_s", math.nan),
            "replicas": 0 if self.allocation is None else self.allocation.num_replicas,
        }
        self.history.append({"start": start, "end": end, **self.last})
        self._account(start, end)

    def _simulate(self, arrival: np.ndarray, start: float) -> dict[str, float]:
        assert self.spec is not None and self.allocation is not None
        spec, dtype = self.spec, self.allocation.device_type
        n = len(arrival)
        workload = Workload(arrival, np.zeros(n, np.int64), np.ones(n, np.int64),
                            np.ones(n, np.int64))
        table = [0.0] + [spec.latency_s(dtype, b) for b in range(1, spec.batch_limit(dtype) + 1)]

        def batch_latency(requests: Any) -> float:
            return table[len(requests)]

        deadline = arrival + spec.slo_s
        engine = Engine(workload, deadline, BatchingConfig(max_batch=spec.batch_limit(dtype),
                                                           max_wait_s=spec.max_wait_s))
        for i, ready in enumerate(self.ready_at):
            engine.add_group(SimGroup(f"{self.name}-{i}", 1, 1, {0: batch_latency},
                                      {0: max(ready, start)}, device_ids=(i,),
                                      started_at=start))
        result = engine.run()
        served = np.isfinite(result.finish_s)
        self.latencies.extend((result.finish_s[served] - arrival[served]).tolist())
        return summarize_requests(arrival, result.finish_s, result.deadline_s)

    def summary(self) -> dict[str, Any]:
        return {"kind": "serve", "requests": self.requests,
                "slo_attainment": self.good / self.requests if self.requests else 1.0,
                "p99_latency_s": (float(np.percentile(self.latencies, 99)) if self.latencies
                                  else math.nan),
                **self._usage(), "history": self.history}


@dataclass
class SimStream(_Service):
    spec: StreamSpec | None = None
    working: int = 0  # devices processing now
    pending: list[tuple[float, int]] = field(default_factory=list)  # (from time, devices)
    backlog: float = 0.0
    max_lag_s: float = 0.0

    def reallocate(self, allocation: Allocation | None, now: float) -> None:
        assert self.spec is not None
        old = self.allocation
        new = 0 if allocation is None else allocation.num_replicas
        if old is not None and allocation is not None and old.device_type != allocation.device_type:
            self.working = 0  # a new device type: every worker starts afresh
        if new <= self.working:
            self.working, self.pending = new, []
        else:
            self.pending = [(now + self.spec.startup_s, new)]
        self.allocation = allocation

    def advance(self, now: float, seconds: float) -> None:
        window = self._window(now, seconds)
        if window is None:
            return
        assert self.spec is not None
        start, end = window
        t = start
        arrived = 0.0
        window_max = 0.0
        while t < end - 1e-9:
            while self.pending and self.pending[0][0] <= t + 1e-9:
                self.working = self.pending.pop(0)[1]
            dt = min(STREAM_STEP_S, end - t)
            rate = self.spec.rate_at(t - self.submit_time)
            dtype = self.allocation.device_type if self.allocation is not None else None
            capacity = self.spec.capacity(dtype, self.working) if dtype else 0.0
            self.backlog = max(0.0, self.backlog + (rate - capacity) * dt)
            arrived += rate * dt
            t += dt
            window_max = max(window_max, self.backlog / rate if rate > 0 else 0.0)
        rate_now = self.spec.rate_at(end - self.submit_time)
        self.max_lag_s = max(self.max_lag_s, window_max)
        self.last = {
            "input_rate": arrived / (end - start),
            "backlog": self.backlog,
            "lag_s": self.backlog / rate_now if rate_now > 0 else 0.0,
            "max_lag_s": window_max,
            "replicas": 0 if self.allocation is None else self.allocation.num_replicas,
            "working": self.working,
        }
        self.history.append({"start": start, "end": end, **self.last})
        self._account(start, end)

    def summary(self) -> dict[str, Any]:
        return {"kind": "stream", "max_lag_s": self.max_lag_s,
                "final_lag_s": self.last.get("lag_s", 0.0), **self._usage(),
                "history": self.history}


class SimServices:
    """The simulator's serve and stream jobs."""

    def __init__(self, cluster: ClusterState):
        self.cluster = cluster
        self.jobs: dict[str, SimServe | SimStream] = {}
        self._reported_done: set[str] = set()

    def owns(self, name: str) -> bool:
        return name in self.jobs

    def admit(self, spec: JobSpec) -> JobLimits:
        """Register a serve or stream job; SpecError when it cannot be simulated."""
        kind = spec.kind
        if not service_device_types(spec, self.cluster):
            what = "latency" if kind == "serve" else "throughput"
            section = spec.serve if kind == "serve" else spec.stream
            assert section is not None
            raise SpecError(f"no profile for this cluster's device types "
                            f"{self.cluster.device_types} (profiled: {section.device_types}"
                            + (f", allowed: {spec.device_types}" if spec.device_types else "")
                            + ")", field=f"{kind}.{what}")
        if kind == "serve":
            self.jobs[spec.name] = self._admit_serve(spec)
        else:
            self.jobs[spec.name] = self._admit_stream(spec)
        return service_limits(spec)

    def _admit_serve(self, spec: JobSpec) -> SimServe:
        serve = spec.serve
        assert serve is not None
        usable = [t for t in service_device_types(spec, self.cluster)
                  if serve.replica_capacity(t) > 0]
        if not usable:
            raise SpecError(f"a single request takes longer than slo_s={serve.slo_s} s on every "
                            "device type of this cluster; raise slo_s or profile a faster type",
                            field="serve.slo_s")
        if serve.arrival is None:
            raise SpecError("the simulator replays the arrivals: add arrival: rate: 10 (a "
                            "Gamma process, requests/s) or trace: requests.csv",
                            field="serve.arrival")
        if serve.arrival.trace is not None:
            offsets = trace_arrivals(serve.arrival, serve.model)
            duration = serve.duration_s or float(offsets[-1]) + serve.slo_s
            offsets = offsets[offsets < duration]
        else:
            if serve.duration_s is None:
                raise SpecError("a simulated serve job with Gamma arrivals needs duration_s "
                                "(how long it runs, seconds)", field="serve.duration_s")
            duration = serve.duration_s
            offsets = gamma_process(serve.arrival, duration)
        return SimServe(spec.name, spec.submit_time, spec.submit_time + duration, spec=serve,
                        arrivals=spec.submit_time + offsets)

    def _admit_stream(self, spec: JobSpec) -> SimStream:
        stream = spec.stream
        assert stream is not None
        if stream.duration_s is None:
            raise SpecError("a simulated stream job needs duration_s (how long it runs, "
                            "seconds)", field="stream.duration_s")
        return SimStream(spec.name, spec.submit_time, spec.submit_time + stream.duration_s,
                         spec=stream)

    def apply(self, change: Change, now: float) -> None:
        self.jobs[change.job].reallocate(change.allocation, now)

    def advance(self, now: float, seconds: float) -> None:
        for job in self.jobs.values():
            job.advance(now, seconds)

    def observe(self, now: float) -> list[JobStatus]:
        out = []
        for job in self.jobs.values():
            if job.name in self._reported_done or job.submit_time > now:
                continue
            if job.finished_at is not None:
                self._reported_done.add(job.name)
            out.append(job.status())
        return out

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per service: SLO attainment (serve) or lag (stream), and its per-interval history."""
        return {name: job.summary() for name, job in self.jobs.items()}
