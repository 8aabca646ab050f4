"""One job's life on a Ray cluster: the local backend's life cycle over Ray actors.

:class:`RayJob` is the local backend's :class:`~shoal.backends.local.job.LocalJob` (targets,
stop by checkpoint, exit-code protocol, crash retries, persistence) with three differences:
an allocation first becomes a placement group (the job starts once it is ready), replicas are
:class:`~shoal.backends.ray.replicas.RayReplica` actors on the allocation's nodes, and the
checkpoint folder lives under a location every node can read.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from shoal.backends.local.job import STALE_VARIABLES, LocalJob, Phase, RunSettings
from shoal.backends.ray.nodes import NodeRegistry, RayNode
from shoal.backends.ray.replicas import launch, release, reserve
from shoal.core.types import Allocation

log = logging.getLogger(__name__)

_RESERVE_WAIT_S = 1.0  # how long one tick waits for a new placement group
_RESERVE_WARN_S = 60.0  # a placement group pending this long is reported in the log
# Between rounds a running job's actors are asked for their exit at most this often: each look
# is a Ray call per replica, so a finish is noticed within this time at a bounded cost.
_WATCH_EVERY_S = 1.0


@dataclass
class RaySettings(RunSettings):
    """The local backend's settings plus where checkpoints go (a path every node can read)."""

    checkpoint_root: Path | None = None  # default: HOME/checkpoints (one machine, or shared)
    # Memory of a device whose node has no shoal.io/device-memory-gb label (--slot-memory-gb).
    device_memory_gb: float | None = None


def _loopback(address: str) -> bool:
    return address.startswith("127.")


@dataclass
class RayJob(LocalJob):
    registry: NodeRegistry = field(default_factory=NodeRegistry)
    group: Any = None  # the placement group of ``group_for``
    group_for: Allocation | None = None
    _group_ready: Any = None
    _group_ok: bool = False
    _group_since: float = 0.0
    _group_warned: bool = False
    hosts: tuple[RayNode, ...] = ()  # the shoal node of each rank of the running allocation

    @property
    def checkpoint_dir(self) -> Path:
        root = getattr(self.settings, "checkpoint_root", None)
        return Path(root) / self.name if root else self.settings.home / "checkpoints" / self.name

    # ----- reservation -----
    def _reserved(self, allocation: Allocation) -> bool:
        """True once a placement group for ``allocation`` is ready (created on first call)."""
        if self.group is not None and self.group_for == allocation:
            if not self._group_ok:
                ready, _ = ray.wait([self._group_ready], timeout=0)
                self._group_ok = bool(ready)
                waited = time.time() - self._group_since
                if not self._group_ok and waited > _RESERVE_WARN_S and not self._group_warned:
                    self._group_warned = True
                    log.warning("%s: Ray has not granted %s for %.0f s (resources taken by "
                                "others?)", self.name, dict(self.group.bundle_specs[0]), waited)
            return self._group_ok
        self._drop_group()
        hosts = [self.registry.get(n) for n in allocation.nodes]
        if any(h is None or h.device_type != allocation.device_type for h in hosts):
            return False  # a node left the cluster: wait for a new allocation
        self.group = reserve([h for h in hosts if h is not None])
        self.group_for = allocation
        self._group_since, self._group_warned = time.time(), False
        self._group_ready = self.group.ready()
        ready, _ = ray.wait([self._group_ready], timeout=_RESERVE_WAIT_S)
        self._group_ok = bool(ready)
        return self._group_ok

    def _drop_group(self) -> None:
        release(self.group)
        self.group, self.group_for, self._group_ready, self._group_ok = None, None, None, False

    def _release(self) -> None:
        for replica in self.replicas:
            replica.signal(signal.SIGKILL)
        self._drop_group()

    # ----- the local life cycle, on Ray -----
    @property
    def awaiting_group(self) -> bool:
        """Placed but not started: Ray has not granted the placement group yet (typically the
        devices' previous holder's group is still being removed)."""
        return self.phase == Phase.IDLE and self.target is not None and not self.cancelled

    @property
    def watch_between_rounds(self) -> bool:
        """In transition, waiting for its placement group, or running and not looked at for
        ``_WATCH_EVERY_S``: so the service sees a job end (and a policy deciding at
        completions hands its devices out) within about a second, and a job placed on devices
        Ray is still freeing starts as soon as they are free, not at the next round."""
        due = time.time() - self._last_tick >= _WATCH_EVERY_S
        waiting = self.awaiting_group and due
        return self.in_transition or waiting or (self.phase == Phase.RUNNING and due)

    def tick(self, now: float) -> None:
        if self.phase == Phase.IDLE and (self.target is None or self.cancelled):
            self._drop_group()
        super().tick(now)  # starts the job (see start) once its placement group is ready
        for replica in self.replicas:
            if replica.exit_code() is None:
                replica.pump_log()

    def environment(self, allocation: Allocation, hosts: list[RayNode],
                    rank: int) -> dict[str, str]:
        """The local contract, with node-aware local ranks and rank 0's node as master."""
        env = self.contract_environment(allocation, rank, 0)
        env.pop("MASTER_PORT", None)  # rank 0's actor picks a free port on its node
        # Ray gives each replica's actor its GPU and sets CUDA_VISIBLE_DEVICES there; the
        # service machine's GPU slots say nothing about other nodes' devices.
        env.pop("CUDA_VISIBLE_DEVICES", None)
        node = hosts[rank].ray_id
        on_node = [r for r, h in enumerate(hosts) if h.ray_id == node]
        env.update(
            LOCAL_RANK=str(on_node.index(rank)),
            LOCAL_WORLD_SIZE=str(len(on_node)),
            MASTER_ADDR=hosts[0].address,
            SHOAL_NUM_NODES=str(len({h.ray_id for h in hosts})),
        )
        if not all(_loopback(h.address) for h in hosts):
            env.pop("GLOO_SOCKET_IFNAME", None)  # a real network: the node's own setting
        return env

    def start(self, now: float) -> None:
        """Start once Ray has granted the placement group (else stay idle; ticks look again).

        Resizes stop and restart (no pre-warmed standby replicas: the new allocation's devices
        are usually the running replicas' own)."""
        allocation = self.target
        assert allocation is not None and self.phase == Phase.IDLE
        if not self._reserved(allocation):
            return
        if not self.registry.alive(allocation.nodes):  # left since the reservation
            self._drop_group()
            return
        super().start(now)

    def _spawn(self, allocation: Allocation, go_file: Path | None = None) -> list[Any]:
        """One actor per rank in the placement group (the local backend spawns processes)."""
        hosts = [self.registry.get(n) for n in allocation.nodes]
        ranks = [h for h in hosts if h is not None]
        for directory in (self.log_dir, self.checkpoint_dir, self.run_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self.attempt += 1
        self.model.device_type = allocation.device_type
        stamp = time.strftime("%H:%M:%S")
        headers = [
            f"=== shoal: attempt {self.attempt}, {allocation.num_replicas} replica(s) on "
            f"{allocation.device_type}, {stamp} === rank {rank}, Ray node {host.ray_id[:8]}"
            for rank, host in enumerate(ranks)
        ]
        self.hosts = tuple(ranks)
        return launch(
            self.group, ranks, list(self.spec.command or []),
            [self.environment(allocation, ranks, rank) for rank in range(len(ranks))],
            STALE_VARIABLES, self.workdir,
            [self.log_dir / f"rank{rank}.log" for rank in range(len(ranks))], headers,
        )

    def _to_idle(self, now: float) -> None:
        self._release()
        super()._to_idle(now)

    def _finish(self, now: float) -> None:
        self._release()
        super()._finish(now)

    def _fail(self, reason: str) -> None:
        self._release()
        super()._fail(reason)

    # ----- a restarted service -----
    def adopt(self, now: float) -> None:
        """Counters from the previous service; its actors ended with it, so start again."""
        try:
            data = json.loads(self._run_file.read_text())
        except (FileNotFoundError, ValueError):
            data = {}
        self.attempt = int(data.get("attempt") or 0)
        self.crashes = int(data.get("crashes") or 0)
        self.resizes = int(data.get("resizes") or 0)
        self.device_seconds = float(data.get("device_seconds") or 0.0)
        self.runs = [(float(t), int(n)) for t, n in data.get("runs", [])]
        self._restore_probes(data)
        alloc = data.get("allocation")
        if alloc:
            self.running_allocation = Allocation(str(alloc[0]), tuple(int(n) for n in alloc[1]))
        self.replicas = []
        self.phase = Phase.IDLE
