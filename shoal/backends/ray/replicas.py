"""A job's replicas as Ray actors: placement groups, launch, exit codes, signals and logs.

The service side of :mod:`shoal.backends.ray.actor`. A :class:`RayReplica` offers what the
local backend's ``Replica`` offers (``rank``, ``exit_code()``, ``signal()``, ``pid``,
``to_json()``), so the local backend's job life cycle drives Ray replicas unchanged. Nothing
here blocks for long: exit codes, pids and log output are polled with ``ray.wait(timeout=0)``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal as signals
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from shoal.backends.local.replicas import EXIT_VANISHED
from shoal.backends.ray.actor import ReplicaActor
from shoal.backends.ray.nodes import NODE_ID_LABEL, RayNode

log = logging.getLogger(__name__)

_FINAL_LOG_WAIT_S = 5.0
_ACTOR_CONCURRENCY = 8  # run, pid, signal and read_log at once


def reserve(hosts: Sequence[RayNode]) -> PlacementGroup:
    """A placement group with one bundle per rank, each pinned to its rank's Ray node.

    One node: ``STRICT_PACK``. Several: ``PACK`` with a node selector per bundle, so the
    replicas land exactly where placement put them (whole nodes, in rank order).
    """
    bundles = [dict(h.bundle) for h in hosts]
    selectors = [{NODE_ID_LABEL: h.ray_id} for h in hosts]
    strategy = "STRICT_PACK" if len({h.ray_id for h in hosts}) == 1 else "PACK"
    return placement_group(bundles, strategy=strategy, bundle_label_selector=selectors)


def release(group: PlacementGroup | None) -> None:
    if group is not None:
        with contextlib.suppress(Exception):
            remove_placement_group(group)


def _actor_options(bundle: Mapping[str, float]) -> dict[str, Any]:
    """Ask for the bundle's resources, so Ray isolates them (e.g. CUDA_VISIBLE_DEVICES)."""
    options: dict[str, Any] = {"num_cpus": bundle.get("CPU", 0.0)}
    if bundle.get("GPU"):
        options["num_gpus"] = bundle["GPU"]
    custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
    if custom:
        options["resources"] = custom
    return options


@dataclass
class RayReplica:
    rank: int
    actor: Any  # ActorHandle of ReplicaActor
    run_ref: Any  # ObjectRef[int]
    pid_ref: Any  # ObjectRef[int | None]
    address: str
    log_path: Path
    _exit: int | None = None
    _pid: int | None = None
    _offset: int = 0
    _log_ref: Any = None
    _error: str | None = field(default=None, repr=False)

    # ----- the Replica interface of the local backend -----
    def exit_code(self) -> int | None:
        """The replica's exit code, or None while it runs (EXIT_VANISHED: its actor died)."""
        if self._exit is not None:
            return self._exit
        ready, _ = ray.wait([self.run_ref], timeout=0)
        if not ready:
            return None
        try:
            code = int(ray.get(self.run_ref))
        except RayError as exc:
            self._error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            self._append(f"shoal: the replica's Ray actor ended ({self._error})\n".encode())
            code = EXIT_VANISHED
        else:
            self._drain_log(_FINAL_LOG_WAIT_S)
        self._exit = code
        return code

    @property
    def pid(self) -> int | None:
        """The training process's pid on its node, once known."""
        if self._pid is None:
            ready, _ = ray.wait([self.pid_ref], timeout=0)
            if ready:
                with contextlib.suppress(RayError):
                    self._pid = ray.get(self.pid_ref)
        return self._pid

    def signal(self, signum: int) -> None:
        """SIGKILL ends the actor (its command dies with it); other signals are forwarded."""
        if signum == signals.SIGKILL:
            with contextlib.suppress(Exception):
                ray.kill(self.actor, no_restart=True)
            return
        with contextlib.suppress(Exception):
            self.actor.signal.remote(int(signum))

    def to_json(self) -> dict[str, object]:
        return {"rank": self.rank, "address": self.address, "pid": self.pid}

    # ----- logs -----
    def pump_log(self, wait_s: float = 0.0) -> None:
        """Append the output fetched since the last call to the rank's log file."""
        if self._log_ref is None:
            self._log_ref = self.actor.read_log.remote(self._offset)
        ready, _ = ray.wait([self._log_ref], timeout=wait_s)
        if not ready:
            return
        ref, self._log_ref = self._log_ref, None
        try:
            start, data = ray.get(ref)
        except RayError:
            return
        if start > self._offset:
            self._append(f"shoal: {start - self._offset} bytes of output were dropped\n".encode())
        self._append(data)
        self._offset = start + len(data)

    def _drain_log(self, wait_s: float) -> None:
        """After the command ended: a read still in flight was issued before its last output,
        so take that one and then one more from the new offset."""
        deadline = time.monotonic() + wait_s
        for _ in range(2):
            self.pump_log(wait_s=max(0.0, deadline - time.monotonic()))

    def _append(self, data: bytes) -> None:
        if data:
            with self.log_path.open("ab") as handle:
                handle.write(data)


@functools.cache
def _remote_actor() -> Any:
    return ray.remote(max_concurrency=_ACTOR_CONCURRENCY, max_restarts=0)(ReplicaActor)


def launch(
    group: PlacementGroup,
    hosts: Sequence[RayNode],
    command: Sequence[str],
    envs: Sequence[Mapping[str, str]],
    drop: Sequence[str],
    cwd: Path,
    log_paths: Sequence[Path],
    headers: Sequence[str],
) -> list[RayReplica]:
    """One actor per rank in its bundle; every rank gets rank 0's free port as MASTER_PORT."""
    actors = [
        _remote_actor().options(  # type: ignore[attr-defined]
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=rank),
            **_actor_options(host.bundle),
        ).remote(headers[rank])
        for rank, host in enumerate(hosts)
    ]
    port = actors[0].free_port.remote()
    replicas = []
    for rank, (actor, host) in enumerate(zip(actors, hosts, strict=True)):
        run = actor.run.remote(list(command), dict(envs[rank]), list(drop), str(cwd), port)
        replicas.append(RayReplica(rank, actor, run, actor.pid.remote(), host.address,
                                   log_paths[rank]))
    return replicas
