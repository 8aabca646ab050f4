"""Probes: a new job's step time on each device type it may run on, measured on a free device.

On a cluster of several device types the scheduler compares a job's goodput across types
before the job has run on most of them. Sia profiles every new job on the smallest
configuration of each type; here a probe is the job's own program on one free device of a type
the job has not measured, run for ``PROBE_STEPS`` steps from scratch (``SHOAL_PROBE_STEPS``,
no checkpoint directory, so the job's checkpoints are untouched). Its report is marked
``probe``: the job's model takes its step times for that type and nothing else
(:meth:`~shoal.backends.local.model.JobModel.update`), and larger sizes on the type are
projected from the scaling the job shows on the type it runs on. Until a probe reports, the
type is predicted from the ratio of peak rates, as before.

A probe only takes a device no job's allocation holds, and a job placed on that device starts
when the probe ends (its placement group waits; a probe lasts a start-up and a few steps, and
is stopped after ``PROBE_TIMEOUT_S``). Each type is probed at most once per job, once the job
has been placed, and not on a type it is placed on at the time (it measures that one itself).
Probe device time is the job's ``profiling_seconds``.
"""

from __future__ import annotations

import logging
import signal
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import ray

from shoal.backends.local.job import STALE_VARIABLES
from shoal.backends.ray.job import RayJob
from shoal.backends.ray.nodes import NodeRegistry, RayNode
from shoal.backends.ray.replicas import RayReplica, launch, release, reserve
from shoal.core.types import Allocation

log = logging.getLogger(__name__)

PROBE_STEPS = 10  # the trainer leaves its first 2 steps out of the profile (warm-up)
PROBE_TIMEOUT_S = 180.0  # from launch; a probe still running then is stopped
RESERVE_TIMEOUT_S = 30.0  # a probe whose device Ray has not granted by then is dropped
# What a probe must not inherit from the node: it trains from scratch and never checkpoints.
_DROP = (*STALE_VARIABLES, "SHOAL_CHECKPOINT_DIR", "SHOAL_CHECKPOINT_INTERVAL")


@dataclass
class Probe:
    job: str
    device_type: str
    host: RayNode
    group: Any
    ready: Any  # the placement group's ready() reference
    reserved_at: float
    replica: RayReplica | None = None
    launched_at: float | None = None


class Prober:
    def __init__(self, registry: NodeRegistry, steps: int = PROBE_STEPS,
                 timeout_s: float = PROBE_TIMEOUT_S):
        self.registry = registry
        self.steps = steps
        self.timeout_s = timeout_s
        self.running: dict[tuple[str, str], Probe] = {}
        self.tried: dict[str, set[str]] = {}

    def step(self, jobs: Mapping[str, RayJob], used: Counter[int], now: float) -> None:
        """End the probes that are done (or whose job ended), then start those now possible
        on devices that neither ``used`` (per shoal node) nor another probe holds."""
        for key, probe in list(self.running.items()):
            job = jobs.get(probe.job)
            if self._settle(probe, job, now):
                del self.running[key]
        busy = used + Counter(p.host.node_id for p in self.running.values())
        for job in jobs.values():
            for dtype in self._wanted(job):
                host = self._free_node(dtype, busy)
                if host is None:
                    continue
                self.tried.setdefault(job.name, set()).add(dtype)
                busy[host.node_id] += 1
                group = reserve([host])
                self.running[(job.name, dtype)] = Probe(job.name, dtype, host, group,
                                                        group.ready(), now)

    def _wanted(self, job: RayJob) -> list[str]:
        """Types the job may run on, has not measured, nor been probed or placed on."""
        if job.terminal or job.cancelled or job.spec.kind != "train" or job.model.planned_types:
            return []
        offered = {node.device_type for node in self.registry.nodes}
        allowed = [t for t in sorted(offered) if not job.spec.device_types
                   or t in job.spec.device_types]
        if len(allowed) < 2:
            return []
        placed = {a.device_type for a in (job.target, job.running_allocation) if a is not None}
        if not placed:
            return []  # placed first: the type it gets is measured by its own run
        known = set(job.model.rows_by_type()) | self.tried.get(job.name, set()) | placed
        return [t for t in allowed if t not in known]

    def _free_node(self, dtype: str, busy: Counter[int]) -> RayNode | None:
        for node in self.registry.nodes:
            if node.device_type == dtype and node.capacity - busy[node.node_id] > 0:
                return node
        return None

    def _settle(self, probe: Probe, job: RayJob | None, now: float) -> bool:
        """Advance one probe; True once it is over (its device released)."""
        if job is None or job.terminal or job.cancelled:
            self._end(probe, job, now, "its job ended")
            return True
        if probe.replica is None:
            ready, _ = ray.wait([probe.ready], timeout=0)
            if ready:
                self._launch(probe, job, now)
            elif now - probe.reserved_at > RESERVE_TIMEOUT_S:
                self._end(probe, job, now, "Ray did not grant its device")
                return True
            return False
        probe.replica.pump_log()
        code = probe.replica.exit_code()
        if code is not None:
            self._end(probe, job, now, f"exit code {code}")
            return True
        if probe.launched_at is not None and now - probe.launched_at > self.timeout_s:
            self._end(probe, job, now, f"still running after {self.timeout_s:.0f} s")
            return True
        return False

    def _launch(self, probe: Probe, job: RayJob, now: float) -> None:
        allocation = Allocation(probe.device_type, (probe.host.node_id,))
        env = job.environment(allocation, [probe.host], 0)
        for name in _DROP:
            env.pop(name, None)
        env["SHOAL_PROBE_STEPS"] = str(self.steps)
        if job.settings.scheduler_url:
            env["SHOAL_SCHEDULER_URL"] = job.settings.scheduler_url
        job.log_dir.mkdir(parents=True, exist_ok=True)
        header = (f"=== shoal: probe of {self.steps} steps on {probe.device_type}, "
                  f"{time.strftime('%H:%M:%S')} === Ray node {probe.host.ray_id[:8]}")
        [probe.replica] = launch(probe.group, [probe.host], list(job.spec.command or []),
                                 [env], _DROP, job.workdir,
                                 [job.log_dir / f"probe-{probe.device_type}.log"], [header])
        probe.launched_at = now
        log.info("%s: probing %s on Ray node %s", job.name, probe.device_type,
                 probe.host.ray_id[:8])

    def _end(self, probe: Probe, job: RayJob | None, now: float, why: str) -> None:
        if probe.replica is not None:
            if probe.replica.exit_code() is None:
                probe.replica.signal(signal.SIGKILL)
            probe.replica.pump_log(wait_s=1.0)
        release(probe.group)
        if job is not None and probe.launched_at is not None:
            job.profiling_seconds += now - probe.launched_at
        log.info("%s: probe on %s over (%s)", probe.job, probe.device_type, why)

    def close(self) -> None:
        for probe in self.running.values():
            self._end(probe, None, time.time(), "the service stops")
        self.running.clear()
