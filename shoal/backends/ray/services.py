"""Serve jobs on a Ray cluster: model servers as Ray actors on the allocation's nodes.

The local backend's :class:`~shoal.backends.local.services.LocalServeJob` (router, rate
measurement, SLO scoring, resizes), with each model server started by a Ray actor in a
one-bundle placement group pinned to the node the scheduler chose, listening on that node's
address. The router stays a process on the service's machine and forwards to the servers over
the network. A server dies with its actor, which the service owns.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoal.backends.local.services import LocalServeJob
from shoal.backends.ray.nodes import NodeRegistry
from shoal.backends.ray.replicas import RayReplica, launch, release, reserve

# Model servers need no files of the submit directory; every node has a root directory.
_SERVER_CWD = Path("/")


@dataclass
class RayServer:
    """One model server, run by a Ray actor on the node of the scheduler's allocation."""

    name: str
    node: int
    host: str
    replica: RayReplica
    group: Any  # its placement group
    log_path: Path
    url: str = ""

    @property
    def pid(self) -> int | None:
        return None  # a process on another node, which ends with its actor

    def log(self) -> str:
        self.replica.pump_log()
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def exited(self) -> int | None:
        return self.replica.exit_code()

    def stop(self) -> None:
        self.replica.signal(signal.SIGKILL)
        release(self.group)


@dataclass
class RayServeJob(LocalServeJob):
    registry: NodeRegistry = field(default_factory=NodeRegistry)

    def _start_replica(self, node: int) -> RayServer | None:
        host = self.registry.get(node)
        if host is None or self.target is None or host.device_type != self.target.device_type:
            return None  # the node left the cluster: a later allocation places the server
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._seq += 1
        name = f"replica-{self._seq}"
        log_path = self.log_dir / f"{name}.log"
        threads = str(self.settings.pool.threads_per_slot)
        env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "PYTHONUNBUFFERED": "1"}
        header = (f"=== shoal: {self.name} {name} on {host.device_type}, "
                  f"{time.strftime('%H:%M:%S')} === Ray node {host.ray_id[:8]}")
        group = reserve([host])
        command = ["python", "-m", "shoal.serve.server", *self.server_args(host.address)]
        [replica] = launch(group, [host], command, [env], [], _SERVER_CWD, [log_path], [header])
        return RayServer(name, node, host.address, replica, group, log_path)
