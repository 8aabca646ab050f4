"""Serve and stream jobs on a Ray cluster: model servers and stream workers as Ray actors on
the allocation's nodes.

The local backend's :class:`~shoal.backends.local.services.LocalServeJob` (router, rate
measurement, SLO scoring, resizes), with each model server started by a Ray actor in a
one-bundle placement group pinned to the node the scheduler chose, listening on that node's
address. The router stays a process on the service's machine and forwards to the servers over
the network. A server dies with its actor, which the service owns. Stream jobs
(:class:`~shoal.backends.local.streams.LocalStreamJob`) run their workers the same way and
keep their stream source on the service's machine.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoal.backends.local.services import LocalServeJob
from shoal.backends.local.streams import LocalStreamJob
from shoal.backends.ray.nodes import NodeRegistry
from shoal.backends.ray.replicas import RayReplica, launch, release, reserve
from shoal.serve.stream_worker import SPEED_VARIABLE

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
        if host is None:
            return None
        return _start_on_node(self, self.registry, node, "replica",
                              ["shoal.serve.server", *self.server_args(host.address)])


@dataclass
class RayStreamJob(LocalStreamJob):
    """A stream job whose workers run on the cluster's nodes; the source stays on the service's
    machine (listening on the service's ``--host``, so workers elsewhere reach it)."""

    registry: NodeRegistry = field(default_factory=NodeRegistry)

    def _start_replica(self, node: int) -> RayServer | None:
        if self.url is None:
            return None
        return _start_on_node(self, self.registry, node, "worker",
                              ["shoal.serve.stream_worker", *self.worker_args()],
                              stream_worker_environment())


def stream_worker_environment(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """What a stream worker on another node takes from the service's environment: the pace
    a slower device is emulated at (``SHOAL_STREAM_WORKER_SPEED``), as local workers inherit it.
    """
    return {SPEED_VARIABLE: environ[SPEED_VARIABLE]} if SPEED_VARIABLE in environ else {}


def _start_on_node(job: LocalServeJob, registry: NodeRegistry, node: int, kind: str,
                   module_args: list[str], extra_env: Mapping[str, str] | None = None,
                   ) -> RayServer | None:
    """``python -m MODULE ARGS`` in a Ray actor pinned to ``node`` (one device of the job's
    type there); None when the node left the cluster (a later allocation places it)."""
    host = registry.get(node)
    if host is None or job.target is None or host.device_type != job.target.device_type:
        return None
    job.log_dir.mkdir(parents=True, exist_ok=True)
    job._seq += 1
    name = f"{kind}-{job._seq}"
    log_path = job.log_dir / f"{name}.log"
    threads = str(job.settings.pool.threads_per_slot)
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "PYTHONUNBUFFERED": "1",
           **(extra_env or {})}
    header = (f"=== shoal: {job.name} {name} on {host.device_type}, "
              f"{time.strftime('%H:%M:%S')} === Ray node {host.ray_id[:8]}")
    group = reserve([host])
    command = ["python", "-m", *module_args]
    [replica] = launch(group, [host], command, [env], [], _SERVER_CWD, [log_path], [header])
    return RayServer(name, node, host.address, replica, group, log_path)
