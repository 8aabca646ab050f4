"""A real two-node Ray cluster on loopback addresses, started with ``ray start`` and stopped by
ending exactly the processes it started (never a machine-wide ``ray stop``, which would also end
other Ray clusters on a shared machine).

Each ``ray start`` runs in its own session; the node's processes (raylet, agents, Ray workers)
stay in that session, so a node is stopped, or "lost", by signalling that session. Training
processes started by shoal's actors die with their actor.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))
HEAD_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"
# Ray rewrites 127.0.0.1 to the outward address; token authentication must match everywhere.
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
OBJECT_STORE = 80 * 1024 * 1024  # Ray's minimum is 75 MiB
# The head declares a node dead after 5 failed health checks 1 s apart (default: 3 s apart),
# so a lost node is noticed in about 5 s; a busy but live node has 5 s to answer each check.
HEALTH_CHECKS = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "5000",
                 "RAY_health_check_failure_threshold": "5"}
START_TIMEOUT_S = 90


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def session_pids(sid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if int(fields[3]) == sid and fields[0] not in ("Z", "X"):  # fields[3]: session id
            pids.append(int(entry.name))
    return pids


def end_session(sid: int, grace_s: float = 5.0) -> None:
    """SIGTERM every process of session ``sid``, then SIGKILL what is left."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        for pid in session_pids(sid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        deadline = time.monotonic() + (grace_s if signum == signal.SIGTERM else 10)
        while session_pids(sid) and time.monotonic() < deadline:
            time.sleep(0.1)


@dataclass
class RayNodeProcess:
    ip: str
    sid: int
    resources: dict[str, float]


@dataclass
class LoopbackCluster:
    """``ray start --head`` on 127.0.0.2 and a second node on 127.0.0.3."""

    head_resources: dict[str, float]
    worker_resources: dict[str, float]
    temp_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="shoal-ray-")))
    port: int = field(default_factory=free_port)
    nodes: list[RayNodeProcess] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"{HEAD_IP}:{self.port}"

    def env(self) -> dict[str, str]:
        return {**os.environ, **RAY_ENV}

    def _start(self, ip: str, resources: dict[str, float], head: bool) -> None:
        args = [RAY, "start", f"--node-ip-address={ip}", "--num-cpus=1",
                f"--object-store-memory={OBJECT_STORE}", f"--resources={json.dumps(resources)}",
                f"--dashboard-agent-listen-port={free_port()}", "--disable-usage-stats",
                "--log-style=record"]
        if head:
            args += ["--head", f"--port={self.port}", "--include-dashboard=false",
                     f"--temp-dir={self.temp_dir}"]
        else:
            args += [f"--address={self.address}"]
        env = {**self.env(), **(HEALTH_CHECKS if head else {})}
        with (self.temp_dir / f"start-{ip}.log").open("ab") as log:
            process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.nodes.append(RayNodeProcess(ip, process.pid, resources))
        try:
            code = process.wait(START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        if code != 0:
            text = (self.temp_dir / f"start-{ip}.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"ray start on {ip} failed ({code}):\n{text}")

    def start(self) -> LoopbackCluster:
        self._start(HEAD_IP, self.head_resources, head=True)
        self._start(WORKER_IP, self.worker_resources, head=False)
        return self

    def start_worker(self, resources: dict[str, float] | None = None) -> None:
        """(Re)start the second node; after a loss it joins as a new Ray node."""
        self._start(WORKER_IP, self.worker_resources if resources is None else resources,
                    head=False)

    def kill_node(self, ip: str) -> int:
        """SIGKILL every Ray process of one node (as if the machine died); how many."""
        node = [n for n in self.nodes if n.ip == ip][-1]
        pids = session_pids(node.sid)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)

    def stop(self) -> None:
        for node in reversed(self.nodes):
            end_session(node.sid)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def status(self) -> str:
        result = subprocess.run([RAY, "status", f"--address={self.address}"], env=self.env(),
                                capture_output=True, text=True, timeout=60)
        return result.stdout + result.stderr
