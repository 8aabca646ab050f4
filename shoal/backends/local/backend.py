"""The local backend: the Backend protocol over real processes on this machine.

One node (id 0) whose devices are the pool's slots. ``apply`` sets each job's target
allocation; ``observe`` polls the processes, starts what is due and reports what the jobs
measured (their reports arrive through :meth:`LocalBackend.report`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shoal.backends.local.devices import DevicePool
from shoal.backends.local.job import LocalJob, Phase, RunSettings
from shoal.backends.local.model import JobModel
from shoal.backends.local.services import LocalServeJob, check_service_spec
from shoal.backends.local.streams import LocalStreamJob
from shoal.core.planned_jobs import PlannedAdmission, admit_model
from shoal.core.types import Change, ClusterState, JobLimits, JobStatus
from shoal.spec.cluster import ClusterSpec, NodeGroup, NodeInfo
from shoal.spec.errors import SpecError
from shoal.spec.job import JobSpec

_BATCH_CHANGE = 0.1  # ask a running job to change batch size when the best differs by this much


class LocalBackend:
    def __init__(self, settings: RunSettings):
        self.settings = settings
        self.pool: DevicePool = settings.pool
        self.jobs: dict[str, LocalJob] = {}
        self.services: dict[str, LocalServeJob] = {}  # serve jobs: model servers + a router
        self.pending_workdir: Path | None = None  # where the next admitted job's command runs
        self._reported_done: set[str] = set()
        self._state = ClusterState((NodeInfo(0, self.pool.device_type, self.pool.slots),))

    # ----- Backend protocol -----
    def now(self) -> float:
        return time.time()

    def cluster(self) -> ClusterState:
        return self._state

    def check_service(self, spec: JobSpec) -> None:
        """SpecError unless this backend can run the serve (or stream) job ``spec``."""
        check_service_spec(spec, [self.pool.device_type])

    def _service(self, spec: JobSpec) -> LocalServeJob:
        if spec.kind == "stream":
            return LocalStreamJob(spec, self.settings)
        return LocalServeJob(spec, self.settings)

    def admit(self, spec: JobSpec, workdir: Path | None = None) -> JobLimits:
        if spec.kind != "train":
            self.check_service(spec)
            section = spec.serve or spec.stream
            assert section is not None
            self.services[spec.name] = self._service(spec)
            capacity = sum(n.capacity for n in self.cluster().nodes
                           if n.device_type in section.device_types
                           and (not spec.device_types or n.device_type in spec.device_types))
            return JobLimits(init_batch_size=1, max_batch_size=1, min_local_bsz=1,
                             max_local_bsz=1,
                             max_replicas=min(capacity, section.max_replicas))
        if not spec.command:
            raise SpecError(
                "the local backend runs a program: add e.g. "
                "command: [\"python\", \"train.py\"]", field="command",
            )
        dtype = self.pool.device_type
        if spec.device_types and dtype not in spec.device_types:
            raise SpecError(
                f"this machine offers '{dtype}' devices, the job allows {spec.device_types}",
                field="device_types",
            )
        planned = None
        if spec.model is not None:
            admitted = self.plan_model(spec)
            limits, planned = admitted.limits, admitted.models
        else:
            limits = self.base_limits(spec)
        self.jobs[spec.name] = LocalJob(
            spec, Path(workdir or self.pending_workdir or Path.cwd()), limits, self.settings,
            JobModel.for_spec(dtype, spec, planned),
        )
        return limits

    def plan_model(self, spec: JobSpec) -> PlannedAdmission:
        """How a job that declares its model is planned here; SpecError when nothing fits.

        Plans are the ones shoal.train.apply_plan runs (no tensor or pipeline parallelism),
        without offload where the devices' memory is the host's."""
        return admit_model(spec, self.cluster_spec(), mode="data-parallel",
                           offload=bool(self.pool.gpu_ids))

    def cluster_spec(self) -> ClusterSpec:
        """This machine as a one-node cluster, with the memory plans are bounded by."""
        device = self.pool.device()
        return ClusterSpec(name="local", device_types=[device], nodes=[
            NodeGroup(device_type=device.name, devices_per_node=self.pool.slots, count=1)])

    def base_limits(self, spec: JobSpec) -> JobLimits:
        """Limits from the spec alone; the job's reports refine them (see JobModel.limits)."""
        init = spec.batch_size or 1
        max_batch = max(spec.max_batch_size or init, init)
        caps = [self.pool.slots, spec.max_replicas or self.pool.slots]
        return JobLimits(
            init_batch_size=init,
            max_batch_size=max_batch,
            min_local_bsz=1,
            max_local_bsz=spec.max_local_bsz or init,
            max_replicas=min(caps),
            fixed_batch=None if spec.adaptive_batch else spec.batch_size,
        )

    def observe(self) -> list[JobStatus]:
        now = self.now()
        out = []
        for job in self.jobs.values():
            job.tick(now)
            if job.name in self._reported_done:
                continue
            if job.terminal:
                self._reported_done.add(job.name)
            limits = job.limits
            out.append(
                JobStatus(
                    job.name,
                    device_seconds=job.device_seconds,
                    finished_at=job.finished_at if job.phase == Phase.FINISHED else None,
                    failed_reason=job.failed_reason,
                    hints=job.model.hints(limits),
                    batch_size=job.model.batch_size,
                    restart_seconds=job.restart_seconds,
                    extra={"running": job.phase == Phase.RUNNING and job.reported_since_start
                           and not job.standby, "profiling_seconds": job.profiling_seconds},
                )
            )
        for service in self.services.values():
            service.tick(now)
            if service.name in self._reported_done:
                continue
            if service.terminal:
                self._reported_done.add(service.name)
            out.append(service.status(now))
        return out

    def apply(self, changes: Sequence[Change]) -> None:
        now = self.now()
        self.assign_slots(changes)
        for change in changes:
            service = self.services.get(change.job)
            if service is not None:
                service.set_target(change.allocation)
                service.tick(now)
                continue
            job = self.jobs.get(change.job)
            if job is None:
                continue
            job.set_target(change.allocation, change.batch_size)
            job.tick(now)

    def assign_slots(self, changes: Sequence[Change]) -> None:
        """Give each changed job concrete slots: the lowest ones no unchanged job holds.

        The core never grants more replicas than slots, so they fit. A resize's old processes
        may still hold their slots for the moment it takes them to checkpoint and exit.
        """
        changing = {c.job for c in changes}
        holders: dict[str, LocalJob | LocalServeJob] = {**self.jobs, **self.services}
        busy = {slot for name, holder in holders.items()
                if name not in changing and not holder.terminal for slot in holder.slot_ids}
        free = [slot for slot in range(self.pool.slots) if slot not in busy]
        for change in changes:
            holder = holders.get(change.job)
            if holder is None:
                continue
            count = change.allocation.num_replicas if change.allocation is not None else 0
            holder.slot_ids, free = tuple(free[:count]), free[count:]

    # ----- beyond the protocol -----
    def poll(self) -> list[str]:
        """Between rounds: move along the jobs that are stopping or pre-warming a resize, so a
        resize waits for processes, not for the next round, and notice exits. Returns the
        jobs that ended (finished or failed) in this call."""
        now = self.now()
        ended = []
        for job in self.jobs.values():
            if job.watch_between_rounds:
                job.tick(now)
                if job.terminal:
                    ended.append(job.name)
        return ended

    def learned_limits(self) -> dict[str, JobLimits]:
        return {name: job.limits for name, job in self.jobs.items() if not job.terminal}

    def report(self, name: str, payload: dict[str, Any]) -> dict[str, Any]:
        """A job's report; the answer may ask it to use a new global batch size."""
        job = self.jobs.get(name)
        if job is None:
            raise KeyError(name)
        job.on_report(payload)
        if payload.get("probe"):
            return {}
        alloc = job.running_allocation
        current = job.model.batch_size
        if job.phase != Phase.RUNNING or alloc is None or not current or payload.get("done"):
            return {}
        best = job.model.best_batch(job.limits, alloc.num_nodes, alloc.num_replicas,
                                    alloc.device_type)
        if best is not None and abs(best - current) > _BATCH_CHANGE * current:
            return {"batch_size": best}
        return {}

    def service_url(self, name: str) -> str | None:
        """The URL a serve job answers on (its router), None until a replica is ready."""
        service = self.services.get(name)
        return service.url if service is not None else None

    def cancel(self, name: str) -> None:
        service = self.services.get(name)
        if service is not None:
            service.cancel()
        job = self.jobs.get(name)
        if job is not None:
            job.cancel()

    def forget(self, name: str) -> None:
        service = self.services.pop(name, None)
        if service is not None:
            service.stop()
        self.jobs.pop(name, None)
        self._reported_done.discard(name)

    def adopt(self, spec: JobSpec, workdir: Path, limits: JobLimits) -> LocalJob:
        """Re-create a job after a service restart; its replicas are re-adopted if alive."""
        planned = self.plan_model(spec).models if spec.model else None
        job = LocalJob(spec, workdir, limits, self.settings,
                       JobModel.for_spec(self.pool.device_type, spec, planned))
        job.adopt(self.now())
        self.jobs[spec.name] = job
        return job

    def stop_all(self, timeout_s: float = 60.0) -> None:
        """Checkpoint and stop every running job (service shutdown); they resume later.

        Serve jobs keep no state: their processes are stopped and start afresh later."""
        for service in self.services.values():
            service.set_target(None)  # else the next observe() would start replicas again
            service.stop()
        for job in self.jobs.values():
            job.drop_standby()
            if job.phase == Phase.RUNNING:
                job.request_stop()
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            for job in self.jobs.values():
                if job.phase == Phase.STOPPING:
                    job.target = None
                    job.tick(self.now())
            if not any(j.phase == Phase.STOPPING for j in self.jobs.values()):
                break
            time.sleep(0.1)
        for job in self.jobs.values():
            job.persist()
