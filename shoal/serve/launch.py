"""Start and stop model-server replicas and a router as processes on loopback.

The contract between a process and its starter: the process binds its own listening socket
(port 0 = the kernel picks a free one, so no port race), and once it accepts connections prints
``SHOAL_SERVE_PORT=<port>`` on stdout. Output goes to log files, which the starter reads.

    with start_serving(replicas=2) as cluster:
        httpx.post(f"{cluster.url}/infer", json={"tokens": [1, 2, 3]})
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from fastapi import FastAPI

READY_PREFIX = "SHOAL_SERVE_PORT="
T = TypeVar("T")
LOOPBACK = "127.0.0.1"


def bind(host: str, port: int) -> socket.socket:
    # proto must say TCP: asyncio only sets TCP_NODELAY on accepted sockets whose proto is
    # IPPROTO_TCP, and without it Nagle + delayed ACK add ~40 ms to every keep-alive reply.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def serve_app(app: FastAPI, host: str, port: int) -> None:
    """Run ``app`` with uvicorn on ``host:port`` and announce the bound port once it accepts."""
    import uvicorn

    sock = bind(host, port)
    # http="httptools" and uvloop: the C parser and event loop take several ms of CPU per
    # request off the pure-Python defaults, which matters on a small shared machine.
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                           http="httptools"))

    async def run() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():
                await task
                return
            await asyncio.sleep(0.01)
        print(f"{READY_PREFIX}{sock.getsockname()[1]}", flush=True)
        await task

    run_fast(run())


def run_fast(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on uvloop's event loop."""
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


@dataclass
class ServiceProcess:
    """One started process: its command, log file and (once ready) URL."""

    name: str
    process: subprocess.Popen
    log_path: Path
    url: str = ""
    host: str = LOOPBACK  # where it listens
    node: int = 0  # the scheduler's node it serves from

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def exited(self) -> int | None:
        """Its exit code, None while it runs."""
        return self.process.poll()

    def log(self) -> str:
        try:
            return self.log_path.read_text()
        except FileNotFoundError:
            return ""

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout_s)


def start_process(name: str, module: str, args: list[str], log_dir: Path,
                  threads: int = 1) -> ServiceProcess:
    log_path = log_dir / f"{name}.log"
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", module, *args], stdout=log,
                                   stderr=subprocess.STDOUT, env=env,
                                   stdin=subprocess.DEVNULL)
    return ServiceProcess(name, process, log_path)


def wait_ready(services: list[ServiceProcess], timeout_s: float, host: str = LOOPBACK) -> None:
    """Wait until every service announced its port; raise with its log if one exits or stalls."""
    deadline = time.monotonic() + timeout_s
    pending = [s for s in services if not s.url]
    while pending:
        for service in list(pending):
            for line in service.log().splitlines():
                if line.startswith(READY_PREFIX):
                    service.url = f"http://{host}:{int(line[len(READY_PREFIX):])}"
                    pending.remove(service)
                    break
            else:
                if service.process.poll() is not None:
                    raise RuntimeError(f"{service.name} exited with code "
                                       f"{service.process.returncode}:\n{service.log()}")
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"{[s.name for s in pending]} not ready after {timeout_s} s:\n"
                               + "\n".join(s.log() for s in pending))
        time.sleep(0.05)


@dataclass
class ServingCluster:
    """Replicas and a router started by :func:`start_serving`; ``url`` is the router's."""

    replicas: list[ServiceProcess]
    router: ServiceProcess
    log_dir: Path
    _tmp: tempfile.TemporaryDirectory | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return self.router.url

    @property
    def replica_urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    def stop(self) -> None:
        for service in [self.router, *self.replicas]:
            service.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> ServingCluster:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def start_serving(replicas: int = 2, max_batch: int = 8, max_wait_s: float = 0.005,
                  policy: str = "least-loaded", seed: int = 0, threads: int = 1,
                  admission: bool = True, log_dir: str | Path | None = None,
                  timeout_s: float = 120.0) -> ServingCluster:
    """Start ``replicas`` model servers and a router over them on 127.0.0.1 (free ports)."""
    if replicas < 1:
        raise ValueError("replicas must be >= 1")
    tmp = None
    if log_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="shoal-serve-")
        log_dir = tmp.name
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    server_args = ["--host", LOOPBACK, "--port", "0", "--max-batch", str(max_batch),
                   "--max-wait-ms", str(max_wait_s * 1000.0), "--seed", str(seed),
                   "--threads", str(threads)]
    if not admission:
        server_args.append("--no-admission")
    started: list[ServiceProcess] = []
    try:
        for i in range(replicas):
            started.append(start_process(f"replica-{i}", "shoal.serve.server", server_args,
                                         log_dir, threads))
        wait_ready(started, timeout_s)
        router_args = ["--host", LOOPBACK, "--port", "0", "--policy", policy]
        for service in started:
            router_args += ["--replica", service.url]
        router = start_process("router", "shoal.serve.router", router_args, log_dir)
        started.append(router)
        wait_ready([router], timeout_s)
    except BaseException:
        for service in started:
            service.stop()
        if tmp is not None:
            tmp.cleanup()
        raise
    return ServingCluster(started[:-1], router, log_dir, tmp)
