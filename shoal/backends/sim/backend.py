"""The simulator backend: a virtual clock and jobs that advance by measured profiles."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping

from shoal.backends.sim.job import SimJob
from shoal.backends.sim.planned import PlannedOracle, PlannedSimJob, admit_planned
from shoal.backends.sim.profile import ApplicationProfile, ProfileLibrary
from shoal.backends.sim.services import SimServices
from shoal.core.types import ClusterState, JobLimits, JobStatus
from shoal.perf.planned import PlanMode
from shoal.spec.cluster import ClusterSpec
from shoal.spec.errors import SpecError
from shoal.spec.job import JobSpec


class SimOracle:
    """Ground truth of one simulated job, for oracle baselines (Optimus)."""

    def __init__(self, job: SimJob, devices_per_node: int,
                 per_node_by_type: Mapping[str, int] | None = None):
        self._job = job
        self._per_node = devices_per_node
        self._per_node_by_type = dict(per_node_by_type or {})

    def remaining_iterations(self, batch_size: int) -> float:
        job, app = self._job, self._job.app
        last = min(app.completion_epoch(batch_size), job.max_epochs - 1)
        if last <= job.epoch:
            return 1.0
        return app.iterations(batch_size, last) - app.iterations(batch_size, job.epoch)

    def step_time(self, num_replicas: int, batch_size: int) -> float:
        job = self._job
        dtype = job.allocation.device_type if job.allocation else next(iter(job.app.devices))
        return self._step_time(dtype, num_replicas, batch_size)

    def throughput(self, device_type: str, num_replicas: int, batch_size: int) -> float:
        """True samples/s at ``num_replicas`` devices of ``device_type`` (packed onto nodes of
        that type) and global ``batch_size``; 0 where the profile has no such configuration."""
        if device_type not in self._job.app.devices:
            return 0.0
        try:
            return batch_size / self._step_time(device_type, num_replicas, batch_size)
        except ValueError:
            return 0.0

    def _step_time(self, dtype: str, num_replicas: int, batch_size: int) -> float:
        job, lim = self._job, self._job.limits
        per_node = self._per_node_by_type.get(dtype, self._per_node)
        placement: tuple[int, ...] = ()
        while sum(placement) < num_replicas:
            placement = (*placement, min(num_replicas - sum(placement), per_node))
        local = math.ceil(batch_size / num_replicas - 1e-8)
        accum = math.ceil(local / lim.max_local_bsz - 1e-8) - 1
        if num_replicas == 1:
            accum = max(1, accum)
        atomic = math.ceil(local / (accum + 1) - 1e-8)
        atomic = min(atomic, int(lim.max_batch_size / (num_replicas * (accum + 1))))
        return job.app.step_time(placement, atomic, accum, dtype)


def _snapshot(job: SimJob | PlannedSimJob) -> dict:
    """A job's mutable state, to wind it back; what it only reads (profiles) is shared."""
    shared = {id(value): value for key, value in vars(job).items()
              if key in ("app", "limits", "model", "models", "type_capacity")}
    return copy.deepcopy(vars(job), shared)


class SimBackend:
    def __init__(self, cluster: ClusterSpec, profiles: ProfileLibrary, restart_delay: float = 30,
                 plan_mode: PlanMode = "search", start_delay: float | None = None,
                 resize_overlap: float = 0.0, finish_delay: float = 0.0,
                 time_resolution: float = 1.0):
        self.spec = cluster
        self.profiles = profiles
        self.restart_delay = restart_delay
        # Restart costs of the backend being simulated (see SimJob): a start from no devices,
        # the seconds a resized job keeps training on its old devices, the end of a job.
        self.start_delay = start_delay
        self.resize_overlap = resize_overlap
        self.finish_delay = finish_delay
        self.time_resolution = time_resolution  # seconds epochs end on (see SimJob)
        self.plan_mode = plan_mode  # how jobs that declare a model pick their parallel plan
        self._state = ClusterState(tuple(cluster.expand()))
        self.services = SimServices(self._state)  # serve and stream jobs
        self._now = 0.0
        self.jobs: dict[str, SimJob | PlannedSimJob] = {}
        self._reported_done: set[str] = set()
        per_node = {n.capacity for n in self._state.nodes}
        self._per_node = max(per_node)
        self.per_node_by_type: dict[str, int] = {}
        for node in self._state.nodes:
            self.per_node_by_type[node.device_type] = max(
                node.capacity, self.per_node_by_type.get(node.device_type, 0))

    # ----- Backend protocol -----
    def now(self) -> float:
        return self._now

    def cluster(self) -> ClusterState:
        return self._state

    def admit(self, spec: JobSpec) -> JobLimits:
        """Register a submitted job; raises SpecError when it cannot be simulated."""
        if spec.kind != "train":
            return self.services.admit(spec)
        if spec.model is not None:
            planned = admit_planned(spec, self.spec, self.restart_delay, self.plan_mode)
            self.jobs[spec.name] = planned
            return planned.limits
        app = self.profiles.get(spec.application)
        missing = set(spec.device_types or []) - set(app.device_types)
        if spec.device_types and missing == set(spec.device_types):
            raise SpecError(
                f"no profile of '{app.name}' for device types {sorted(missing)}; "
                f"profiled: {app.device_types}",
                field="device_types",
            )
        # A type the job may run on but its profiles do not measure cannot be simulated.
        usable = [t for t in self._state.device_types
                  if not spec.device_types or t in spec.device_types]
        unprofiled = [t for t in usable if t not in app.device_types]
        if unprofiled:
            if spec.device_types:
                raise SpecError(
                    f"no profile of '{app.name}' for device types {unprofiled} in "
                    f"{self.profiles.root}; profiled: {app.device_types}; remove them",
                    field="device_types")
            raise SpecError(
                f"the cluster's device types {unprofiled} have no profile of '{app.name}' in "
                f"{self.profiles.root} (profiled: {app.device_types}); use profiles that "
                "measure them, or name the job's device_types", field="profiles")
        if spec.target_epochs and spec.target_epochs > app.available_epochs:
            raise SpecError(
                f"{app.name} has {app.available_epochs} profiled epochs, "
                f"target_epochs={spec.target_epochs} is beyond them",
                field="target_epochs",
            )
        limits = self._limits(spec, app)
        job = SimJob(spec.name, app, limits, spec.submit_time, self.restart_delay,
                     spec.target_epochs, start_delay=self.start_delay,
                     resize_overlap=self.resize_overlap, finish_delay=self.finish_delay,
                     time_resolution=self.time_resolution)
        if len(self._state.device_types) > 1:
            allowed = spec.device_types or self._state.device_types
            job.bootstrap([d for d in self._state.device_types if d in allowed],
                          self.restart_delay)
        self.jobs[spec.name] = job
        return limits

    def _limits(self, spec: JobSpec, app: ApplicationProfile) -> JobLimits:
        max_by_batch = app.max_batch_size // app.min_local_bsz
        # Beyond the largest measured replica count the profile cannot say how a job runs.
        measured = min(int(d.interpolator.points[:, 1].max()) for d in app.devices.values())
        caps = [max_by_batch, app.defaults.max_replicas, spec.max_replicas, measured]
        return JobLimits(
            init_batch_size=app.init_batch_size,
            max_batch_size=app.max_batch_size,
            min_local_bsz=app.min_local_bsz,
            max_local_bsz=app.max_local_bsz,
            max_replicas=min(c for c in caps if c is not None),
            fixed_batch=app.defaults.fixed_batch if spec.adaptive_batch else spec.batch_size,
        )

    def oracle(self, name: str) -> SimOracle | PlannedOracle:
        job = self.jobs[name]
        if isinstance(job, PlannedSimJob):
            return PlannedOracle(job)
        return SimOracle(job, self._per_node, self.per_node_by_type)

    def observe(self) -> list[JobStatus]:
        out = []
        for job in self.jobs.values():
            if job.name in self._reported_done:
                continue
            if job.finished_at is not None:
                self._reported_done.add(job.name)
            if isinstance(job, PlannedSimJob):
                if job.failed_reason is not None:
                    self._reported_done.add(job.name)
                if job.submit_time <= self._now or job.allocation is not None:
                    out.append(job.status())
                continue
            if job.allocation is None and job.finished_at is None and not job.measured:
                if job.submit_time <= self._now:
                    out.append(JobStatus(job.name, job.device_seconds))
                continue
            out.append(
                JobStatus(
                    job.name,
                    device_seconds=job.device_seconds,
                    finished_at=job.finished_at,
                    hints=job.hints(),
                    batch_size=job.batch_size,
                    restart_seconds=job.restart_delay,
                    extra={"epoch": job.epoch, "profiling_seconds": job.profiling_seconds},
                )
            )
        out.extend(self.services.observe(self._now))
        return out

    def apply(self, changes) -> None:
        for change in changes:
            if self.services.owns(change.job):
                self.services.apply(change, self._now)
                continue
            job = self.jobs[change.job]
            if isinstance(job, PlannedSimJob):
                job.reallocate(change.allocation, change.batch_size, now=self._now)
            else:
                job.reallocate(change.allocation, change.batch_size)

    # ----- virtual time -----
    def advance(self, seconds: float) -> None:
        for job in self.jobs.values():
            job.advance(self._now, seconds)
        self.services.advance(self._now, seconds)
        self._now += seconds

    def advance_to_completion(self, seconds: float) -> float:
        """Advance up to ``seconds``, stopping when the first training job finishes (so a
        policy can hand its devices out at once); returns the seconds advanced.

        Jobs advance independently, so this runs every job to the window's end, then winds
        back the jobs that were not the first to finish and runs them to that moment.
        """
        start = self._now
        running = [job for job in self.jobs.values()
                   if job.allocation is not None and job.finished_at is None]
        saved = {job.name: _snapshot(job) for job in running}
        for job in running:
            job.advance(start, seconds)
        ends = [job.finished_at for job in running if job.finished_at is not None]
        first = min(ends, default=start + seconds)
        if first >= start + seconds or first <= start:
            self.services.advance(start, seconds)
            self._now = start + seconds
            return seconds
        for job in running:
            if job.finished_at is None or job.finished_at > first:
                job.__dict__.update(saved[job.name])
                job.advance(start, first - start)
        self.services.advance(start, first - start)
        self._now = first
        return first - start
