"""Serve jobs on the local backend: real model-server replicas behind one router.

A ``kind: serve`` job runs the HTTP serving path of :mod:`shoal.serve`: one model-server
process (:mod:`shoal.serve.server`, the built-in ``tiny`` model) per device of its allocation
and a router (:mod:`shoal.serve.router`) in front of them, all on 127.0.0.1. Nothing blocks a
scheduling round: processes are started, and each round :meth:`LocalServeJob.tick` picks up
the replicas that announced their port, hands the ready set to the router
(``PUT /replicas``) and stops replicas the allocation no longer has (taken out of the router
first, so no request is sent to a stopping replica). The router keeps its URL across resizes.

Each round the job reports the arrival rate the router saw over the last
``RATE_WINDOW_S`` seconds; the scheduler core sizes the job from it and the SLO. The router
also scores its answers against ``serve.slo_s`` (a 200 within the SLO is good; 503 rejects,
502s and late answers are misses): :attr:`LocalServeJob.metrics` holds the SLO attainment
over the job's life, its requests, the recent p99 latency, the replicas and the URL.
"""

from __future__ import annotations

import logging
import socket
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from shoal.backends.local.job import RunSettings
from shoal.core.types import Allocation, JobStatus
from shoal.serve.launch import LOOPBACK, READY_PREFIX, ServiceProcess, start_process
from shoal.spec.errors import SpecError
from shoal.spec.job import JobSpec

log = logging.getLogger(__name__)

LOCAL_MODEL = "tiny"  # the model shoal.serve.server serves
RATE_WINDOW_S = 10.0
MAX_CRASHES = 3


def check_service_spec(spec: JobSpec, device_types: Sequence[str]) -> None:
    """SpecError unless a backend offering ``device_types`` can run ``spec`` (a serve job of
    the tiny model, with a latency profile for an offered type the job allows)."""
    if spec.kind == "stream":
        _check_stream_types(spec, device_types)
        return
    serve = spec.serve
    assert serve is not None
    if serve.model != LOCAL_MODEL:
        raise SpecError(f"shoal serves the built-in model '{LOCAL_MODEL}' "
                        f"(shoal.serve.tiny_model); got '{serve.model}'", field="serve.model")
    offered = ", ".join(f"'{t}'" for t in device_types)
    allowed = [t for t in device_types if not spec.device_types or t in spec.device_types]
    if not allowed:
        raise SpecError(f"the devices offered are {offered}, the job allows "
                        f"{spec.device_types}", field="device_types")
    if not set(allowed) & set(serve.device_types):
        raise SpecError(f"the devices offered are {offered}; add a latency profile for one, "
                        f"e.g. latency: {allowed[0]}: [0.004, 0.005, 0.006]",
                        field="serve.latency")


class ServeReplica(Protocol):
    """A started model server or router (a local process, or a Ray actor's process)."""

    name: str
    url: str  # "" until it announced its port
    host: str
    node: int

    @property
    def pid(self) -> int | None: ...  # on this machine; None for a process elsewhere

    def log(self) -> str: ...

    def exited(self) -> int | None: ...

    def stop(self) -> None: ...


def _check_stream_types(spec: JobSpec, device_types: Sequence[str]) -> None:
    """SpecError unless a stream job allows an offered type it declares a throughput for."""
    assert spec.stream is not None
    offered = ", ".join(f"'{t}'" for t in device_types)
    allowed = [t for t in device_types if not spec.device_types or t in spec.device_types]
    if not allowed:
        raise SpecError(f"the devices offered are {offered}, the job allows "
                        f"{spec.device_types}", field="device_types")
    if not set(allowed) & set(spec.stream.throughput):
        raise SpecError(f"the devices offered are {offered}; add the samples/s one of them "
                        f"processes, e.g. throughput: {{{allowed[0]}: 200}}",
                        field="stream.throughput")


WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def announced_host(settings: RunSettings) -> str:
    """The address a router listening on ``settings.router_host`` is reached at: the
    configured ``router_address``, else the host itself, else (on every interface) this
    machine's address as its own name resolves, loopback if it does not."""
    if settings.router_address:
        return settings.router_address
    if settings.router_host not in WILDCARD_HOSTS:
        return settings.router_host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return LOOPBACK


def _ready_url(service: ServeReplica) -> str | None:
    """The URL a started process announced, None while it starts; RuntimeError if it died."""
    if not service.url:
        for line in service.log().splitlines():
            if line.startswith(READY_PREFIX):
                service.url = f"http://{service.host}:{int(line[len(READY_PREFIX):])}"
                break
    code = service.exited()
    if code is not None:
        raise RuntimeError(f"{service.name} exited with code {code}: "
                           + " | ".join(service.log().strip().splitlines()[-3:]))
    return service.url or None


@dataclass
class LocalServeJob:
    spec: JobSpec
    settings: RunSettings
    target: Allocation | None = None
    replicas: list[ServeReplica] = field(default_factory=list)  # starting or ready
    router: ServiceProcess | None = None
    routed: list[str] = field(default_factory=list)  # what the router forwards to
    device_seconds: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    failed_reason: str | None = None
    crashes: int = 0
    resizes: int = 0
    _seq: int = 0
    _last_tick: float = field(default_factory=time.time)
    _counts: deque[tuple[float, int]] = field(default_factory=deque)  # (time, forwarded)
    _scored: tuple[int, int] = (0, 0)  # (answered, good) by routers that are gone
    _router_scored: tuple[int, int] = (0, 0)  # ... and by the current one
    metrics: dict[str, Any] = field(default_factory=dict)  # the last status' measurements
    slot_ids: tuple[int, ...] = ()  # the pool's slots its replicas hold

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def terminal(self) -> bool:
        return self.finished_at is not None

    @property
    def log_dir(self) -> Path:
        return self.settings.home / "logs" / self.name

    @property
    def url(self) -> str | None:
        """The router's URL once it forwards to at least one ready replica."""
        return self.router.url if self.router is not None and self.routed else None

    @property
    def ready(self) -> list[ServeReplica]:
        return [r for r in self.replicas if r.url]

    # ----- actions -----
    def set_target(self, allocation: Allocation | None) -> None:
        if not self.terminal:
            if self.target is not None and allocation is not None and (
                    allocation.num_replicas != self.target.num_replicas):
                self.resizes += 1
            self.target = allocation

    def cancel(self) -> None:
        self.stop()
        self._end(time.time(), None)

    def stop(self) -> None:
        """Stop the router and every replica."""
        for service in ([self.router] if self.router else []) + self.replicas:
            service.stop()
        self.router, self.replicas, self.routed = None, [], []

    def resume(self, metrics: dict[str, Any]) -> None:
        """Take over what a previous service measured (``metrics`` from its stored record).
        A serve job keeps nothing: its counters start afresh behind a new router."""

    def _release_devices(self) -> None:
        """No devices granted: stop every process (a router without replicas serves nothing)."""
        if self.replicas or self.router:
            self.stop()

    def _end(self, now: float, failure: str | None) -> None:
        if self.finished_at is None:
            self.finished_at = now
            self.failed_reason = failure

    # ----- the round -----
    def tick(self, now: float) -> None:
        if self.terminal:
            return
        self.device_seconds += (now - self._last_tick) * len(self.replicas)
        self._last_tick = now
        section = self.spec.serve or self.spec.stream
        assert section is not None
        if section.duration_s is not None and self.started_at is not None and (
                now - self.started_at >= section.duration_s):
            self.stop()
            self._end(now, None)
            return
        try:
            self._collect()
        except RuntimeError as exc:
            self.crashes += 1
            log.warning("%s: %s", self.name, exc)
            if self.crashes > MAX_CRASHES:
                self.stop()
                self._end(now, f"{exc}; gave up after {MAX_CRASHES} restarts")
                return
        if self.target is None or self.target.num_replicas == 0:
            self._release_devices()
            return
        if self.started_at is None:
            self.started_at = now
        wanted = Counter(self.target.nodes)
        for node in sorted({r.node for r in self.replicas}):
            on_node = [r for r in self.replicas if r.node == node]
            while len(on_node) > wanted[node]:  # starting replicas go first, then the newest
                starting = [r for r in on_node if not r.url]
                victim = starting[-1] if starting else on_node[-1]
                on_node.remove(victim)
                self.replicas.remove(victim)
                self._route()
                victim.stop()
        for node, count in sorted(wanted.items()):
            for _ in range(count - sum(r.node == node for r in self.replicas)):
                replica = self._start_replica(node)
                if replica is not None:
                    self.replicas.append(replica)
        self._route()

    def _collect(self) -> None:
        """Pick up announced ports; drop (and report) processes that died."""
        if self.router is not None:
            try:
                _ready_url(self.router)
            except RuntimeError:
                self.router, self.routed = None, []
                raise
        for replica in list(self.replicas):
            try:
                _ready_url(replica)
            except RuntimeError:
                self.replicas.remove(replica)
                self._route()
                raise

    def server_args(self, host: str) -> list[str]:
        """The model server's arguments for a replica listening on ``host``."""
        serve = self.spec.serve
        assert serve is not None and self.target is not None
        return ["--host", host, "--port", "0",
                "--max-batch", str(serve.batch_limit(self.target.device_type)),
                "--max-wait-ms", str(serve.max_wait_s * 1000.0),
                "--threads", str(self.settings.pool.threads_per_slot)]

    def _start_replica(self, node: int) -> ServeReplica | None:
        """A model server for the target's device on ``node`` (this machine's only node)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._seq += 1
        replica = start_process(f"replica-{self._seq}", "shoal.serve.server",
                                self.server_args(LOOPBACK), self.log_dir,
                                self.settings.pool.threads_per_slot)
        replica.node = node
        return replica

    def _route(self) -> None:
        """Start the router once a replica is ready; keep its replica set = the ready ones."""
        urls = [r.url for r in self.ready]
        if not urls:
            return
        if self.router is None:
            self._seq += 1
            assert self.spec.serve is not None
            args = ["--host", self.settings.router_host, "--port", "0",
                    "--slo", str(self.spec.serve.slo_s)]
            for url in urls:
                args += ["--replica", url]
            self.router = start_process(f"router-{self._seq}", "shoal.serve.router", args,
                                        self.log_dir)
            self.router.host = announced_host(self.settings)
            return
        if not self.router.url or urls == self.routed:
            return
        try:
            answer = httpx.put(f"{self.router.url}/replicas", json={"replicas": urls},
                               timeout=5.0)
            answer.raise_for_status()
            self.routed = urls
        except httpx.HTTPError as exc:
            log.warning("%s: router did not take the replica set: %s", self.name, exc)

    def measure(self, now: float) -> float | None:
        """Requests/s the router forwarded over the last ``RATE_WINDOW_S`` seconds."""
        if self.router is None or not self.router.url:
            return None
        try:
            stats = httpx.get(f"{self.router.url}/stats", timeout=2.0).json()
        except (httpx.HTTPError, ValueError):
            return None
        count = int(stats.get("total_forwarded", 0))
        if self._counts and count < self._counts[-1][1]:
            self._counts.clear()  # a new router: count afresh
        self._score(stats)
        self._counts.append((now, count))
        while len(self._counts) > 2 and self._counts[1][0] <= now - RATE_WINDOW_S:
            self._counts.popleft()
        (t0, c0), (t1, c1) = self._counts[0], self._counts[-1]
        return (c1 - c0) / (t1 - t0) if t1 > t0 else None

    def _score(self, stats: dict[str, Any]) -> None:
        """Fold the router's answered / good counters into the job's (a new router starts
        its counters at 0)."""
        answered, good = int(stats.get("total_answered", 0)), int(stats.get("total_good", 0))
        if answered < self._router_scored[0]:
            self._scored = (self._scored[0] + self._router_scored[0],
                            self._scored[1] + self._router_scored[1])
        self._router_scored = (answered, good)
        p99 = stats.get("p99_latency_s")
        if p99 is not None:
            self.metrics["p99_latency_s"] = float(p99)

    @property
    def pids(self) -> list[int]:
        """Process ids of the router and the replicas (for clean-up after a crash)."""
        services = ([self.router] if self.router else []) + self.replicas
        return [s.pid for s in services if s.pid is not None]

    def status(self, now: float) -> JobStatus:
        extra: dict[str, Any] = {"running": self.url is not None, "url": self.url,
                                 "replicas": len(self.ready)}
        rate = self.measure(now)
        if rate is not None:
            extra["arrival_rate"] = rate
        answered = self._scored[0] + self._router_scored[0]
        good = self._scored[1] + self._router_scored[1]
        extra["requests"] = answered
        extra["slo_attainment"] = good / answered if answered else None
        if "p99_latency_s" in self.metrics:
            extra["p99_latency_s"] = self.metrics["p99_latency_s"]
        if self.terminal:
            extra.update(running=False, url=None, replicas=0)
        self.metrics = {**extra, "slo_s": self.spec.serve.slo_s if self.spec.serve else None}
        return JobStatus(self.name, device_seconds=self.device_seconds,
                         finished_at=self.finished_at if self.failed_reason is None else None,
                         failed_reason=self.failed_reason, extra=extra)
