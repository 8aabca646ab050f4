"""Stream jobs on the local backend (and, through :mod:`shoal.backends.ray.services`, on Ray).

A stream job is run like a serve job (:class:`~shoal.backends.local.services.LocalServeJob`:
one process per granted device, reconciled per node on every tick) with a stream source in
place of the router: the source holds the input arriving at the declared rate, and the
workers pull from it. See docs/serving.md, "Stream jobs on the real backends".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from shoal.backends.local.services import (
    RATE_WINDOW_S,
    LocalServeJob,
    ServeReplica,
    announced_host,
)
from shoal.backends.local.stream_window import SourceSample, StreamWindow
from shoal.core.types import JobStatus
from shoal.serve.launch import start_process


@dataclass
class LocalStreamJob(LocalServeJob):
    """A stream job: a stream source (:mod:`shoal.serve.stream_source`, the job's URL) holding
    the input that arrives at the declared rate, and one worker
    (:mod:`shoal.serve.stream_worker`) per granted device pulling from it. Its status has the
    measured ``input_rate`` (arrivals over the last ``RATE_WINDOW_S``), ``backlog``,
    ``lag_s`` and, once workers have been busy long enough, ``device_speed``: the samples/s
    one device of ``device_type`` really processes. The scheduler's service demand turns
    them into devices (sized by the measured speed rather than the declared throughput)."""

    max_lag_s: float = 0.0  # the largest lag a status has seen
    window: StreamWindow = field(default_factory=lambda: StreamWindow(RATE_WINDOW_S))

    @property
    def url(self) -> str | None:
        return self.router.url if self.router is not None and self.router.url else None

    def worker_args(self) -> list[str]:
        stream = self.spec.stream
        assert stream is not None and self.target is not None and self.url is not None
        return ["--source", self.url, "--samples-per-second",
                str(stream.throughput[self.target.device_type]),
                "--threads", str(self.settings.pool.threads_per_slot)]

    def _start_replica(self, node: int) -> ServeReplica | None:
        """A worker on ``node``, once the source announced its URL (a later tick starts it)."""
        if self.url is None:
            return None
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._seq += 1
        worker = start_process(f"worker-{self._seq}", "shoal.serve.stream_worker",
                               self.worker_args(), self.log_dir,
                               self.settings.pool.threads_per_slot)
        worker.node = node
        return worker

    def _route(self) -> None:
        """Start the source with the job (workers pull from it; nothing to route)."""
        if self.router is not None:
            return
        stream = self.spec.stream
        assert stream is not None
        for worker in self.replicas:  # they pull from a source that is gone: start afresh
            worker.stop()
        self.replicas = []
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._seq += 1
        # A source that died resumes from the count last read from it (at least once).
        args = ["--host", self.settings.router_host, "--port", "0",
                "--rate", str(stream.input_rate), "--origin", str(self.spec.submit_time),
                "--processed", str(int(self.metrics.get("processed") or 0))]
        for step in stream.steps:
            args += ["--step", f"{step.at_s}:{step.rate}"]
        self.router = start_process(f"source-{self._seq}", "shoal.serve.stream_source", args,
                                    self.log_dir)
        self.router.host = announced_host(self.settings)

    def resume(self, metrics: dict[str, Any]) -> None:
        """The stream goes on where a previous service left it: its new source starts at the
        processed count that service stored (what came after is processed again)."""
        self.metrics["processed"] = int(metrics.get("processed") or 0)
        self.max_lag_s = float(metrics.get("max_lag_s") or 0.0)

    def _release_devices(self) -> None:
        """No devices granted: stop the workers; the source keeps the input arriving (and the
        count of what was processed), so the backlog grows until workers return."""
        for worker in self.replicas:
            worker.stop()
        self.replicas = []

    def measure(self, now: float) -> float | None:
        """Samples/s that arrived over the last ``RATE_WINDOW_S`` seconds (and the source's
        other counters into ``metrics``)."""
        if self.url is None:
            return None
        try:
            stats = httpx.get(f"{self.url}/stats", timeout=2.0).json()
        except (httpx.HTTPError, ValueError):
            return None
        self.metrics.update(stats)
        self.window.add(SourceSample(
            now, int(stats["arrived"]), int(stats.get("timed", 0)),
            float(stats.get("busy_s", 0.0)),
            self.target.device_type if self.target is not None and self.ready else None))
        rate = self.window.input_rate()
        return rate if rate is not None else float(stats["input_rate"])

    def status(self, now: float) -> JobStatus:
        extra: dict[str, Any] = {"running": self.url is not None and bool(self.ready),
                                 "url": self.url, "replicas": len(self.ready)}
        rate = self.measure(now)
        if rate is not None:
            lag = float(self.metrics.get("lag_s", 0.0))
            self.max_lag_s = max(self.max_lag_s, lag)
            extra.update(input_rate=rate, backlog=float(self.metrics.get("backlog", 0)),
                         lag_s=lag, processed=int(self.metrics.get("processed", 0)))
            speed = self.window.device_speed()
            if speed is not None:
                extra.update(device_type=speed[0], device_speed=speed[1])
        extra["max_lag_s"] = self.max_lag_s
        if self.terminal:
            extra.update(running=False, url=None, replicas=0)
        assert self.spec.stream is not None
        self.metrics = {**self.metrics, **extra, "lag_bound_s": self.spec.stream.max_lag_s}
        return JobStatus(self.name, device_seconds=self.device_seconds,
                         finished_at=self.finished_at if self.failed_reason is None else None,
                         failed_reason=self.failed_reason, extra=extra)
