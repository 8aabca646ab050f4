"""The Ray backend: the Backend protocol over a Ray cluster's nodes, placement groups and actors.

It is the local backend (same admission, reports, batch-size advice, checkpoint-restart
protocol and persistence) whose device pool is read from the Ray cluster and whose jobs are
:class:`~shoal.backends.ray.job.RayJob`. :meth:`RayBackend.refresh` re-reads the nodes; the
service calls it at the start of every round and takes allocations away from jobs whose nodes
left (they are placed again on what is left and resume from their checkpoints).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import ray

from shoal.backends.local.backend import LocalBackend
from shoal.backends.local.devices import DEFAULT_PEAK_TFLOPS, DevicePool
from shoal.backends.local.model import JobModel
from shoal.backends.local.services import WILDCARD_HOSTS, check_service_spec
from shoal.backends.ray import connect
from shoal.backends.ray.job import RayJob, RaySettings
from shoal.backends.ray.nodes import MEMORY_LABEL, NodeRegistry, RayNode
from shoal.backends.ray.probes import Prober
from shoal.backends.ray.services import RayServeJob, RayStreamJob
from shoal.core.planned_jobs import PlannedAdmission, admit_model
from shoal.core.types import Change, ClusterState, JobLimits
from shoal.perf.parallel import gpu_peak_tflops
from shoal.perf.planned import PlannedGoodput
from shoal.spec.cluster import ClusterSpec, DeviceType, NodeGroup, NodeInfo
from shoal.spec.errors import SpecError
from shoal.spec.job import JobSpec

log = logging.getLogger(__name__)


def peak_tflops(nodes: Iterable[RayNode]) -> dict[str, float]:
    """Per device type the smallest peak rate of its devices: the ``shoal.io/device-tflops``
    label, else the data-sheet peak of a type named after a known GPU, else the default."""
    nodes = list(nodes)
    labelled: dict[str, float] = {}
    for node in nodes:
        if node.peak_tflops is not None:
            labelled[node.device_type] = min(labelled.get(node.device_type, node.peak_tflops),
                                             node.peak_tflops)
    return {node.device_type: labelled.get(node.device_type)
            or gpu_peak_tflops(node.device_type) or DEFAULT_PEAK_TFLOPS for node in nodes}


@dataclass(frozen=True, slots=True)
class RayPool(DevicePool):
    """The cluster's devices as the service shows them (``device_type`` lists every type)."""

    address: str = ""
    num_nodes: int = 0
    per_type: tuple[tuple[str, int], ...] = ()

    def describe(self) -> str:
        types = ", ".join(f"{count} {dtype}" for dtype, count in self.per_type) or "no devices"
        return f"Ray cluster {self.address}: {self.num_nodes} node(s), {types}"


class RayBackend(LocalBackend):
    def __init__(self, settings: RaySettings, address: str | None = None):
        self.started_cluster = connect.connect(address, settings.pool)
        super().__init__(settings)
        self.address = connect.cluster_address()
        self.registry = NodeRegistry(cores_per_slot=settings.pool.threads_per_slot)
        self.prober = Prober(self.registry)
        self.device_memory_gb = settings.device_memory_gb
        settings.scheduler_url = self._reachable(settings.scheduler_url)
        if settings.router_address is None and settings.router_host in WILDCARD_HOSTS:
            settings.router_address = connect.driver_address()  # where Ray's nodes reach us
        self.refresh()
        log.info("Ray backend on %s: %s", self.address, self.pool.describe())

    @staticmethod
    def _reachable(url: str | None) -> str | None:
        """A service listening on every interface is reached at the driver's node address."""
        if not url:
            return url
        parts = urlsplit(url)
        if parts.hostname in ("0.0.0.0", "::"):
            netloc = f"{connect.driver_address()}:{parts.port}"
            return urlunsplit(parts._replace(netloc=netloc))
        return url

    # ----- the device pool -----
    @property
    def pool(self) -> DevicePool:
        nodes = self.registry.nodes if hasattr(self, "registry") else ()
        per_type: dict[str, int] = {}
        for node in nodes:
            per_type[node.device_type] = per_type.get(node.device_type, 0) + node.capacity
        base = self._base_pool
        return RayPool(",".join(per_type) or base.device_type, sum(per_type.values()),
                       base.threads_per_slot, address=getattr(self, "address", ""),
                       num_nodes=len({n.ray_id for n in nodes}),
                       per_type=tuple(per_type.items()))

    @pool.setter
    def pool(self, value: DevicePool) -> None:
        self._base_pool = value

    def refresh(self) -> ClusterState:
        """Re-read the live nodes and their devices."""
        nodes = self.registry.update(ray.nodes())
        self._state = ClusterState(
            tuple(NodeInfo(n.node_id, n.device_type, n.capacity) for n in nodes))
        peaks = peak_tflops(nodes)
        for job in self.jobs.values():
            job.model.type_peaks = peaks  # predicts the types a job has not run on yet
        return self._state

    # ----- probes of device types a job has not run on -----
    def apply(self, changes: Sequence[Change]) -> None:
        super().apply(changes)
        self._probe()

    def poll(self) -> list[str]:
        ended = super().poll()
        self._probe()
        return ended

    def _probe(self) -> None:
        ray_jobs = {name: job for name, job in self.jobs.items() if isinstance(job, RayJob)}
        self.prober.step(ray_jobs, self._devices_held(), self.now())

    def _devices_held(self) -> Counter[int]:
        """Per shoal node, the devices jobs and services hold or are about to (a resizing
        job counts the larger of its old and new allocation on each node)."""
        held: Counter[int] = Counter()
        for job in self.jobs.values():
            if job.terminal:
                continue
            old, new = (Counter(a.nodes) if a is not None else Counter()
                        for a in (job.running_allocation, job.target))
            held.update(old | new)
        for service in self.services.values():
            if not service.terminal and service.target is not None:
                held.update(service.target.nodes)
        return held

    # ----- admission -----
    def _capacity(self, spec: JobSpec) -> int:
        allowed = spec.device_types
        return sum(n.capacity for n in self._state.nodes
                   if not allowed or n.device_type in allowed)

    def plan_model(self, spec: JobSpec) -> PlannedAdmission:
        """How a job that declares its model is planned on the cluster's devices (the plans
        ``shoal.train`` applies, offloading only where every device is a GPU); SpecError when
        nothing fits or a device type's memory is unknown."""
        gpus_only = all(node.gpu for node in self.registry.nodes)
        return admit_model(spec, self.cluster_spec(), mode="data-parallel", offload=gpus_only)

    def cluster_spec(self) -> ClusterSpec:
        """The live nodes as a cluster, each type with the smallest memory any of its devices
        has: the node's ``shoal.io/device-memory-gb`` label, else ``--slot-memory-gb``; and the
        smallest peak rate: the ``shoal.io/device-tflops`` label, else the data-sheet peak of a
        type named after a known GPU (``a100``, ``t4``...), else the default."""
        nodes = self.registry.nodes
        if not nodes:
            raise SpecError("the Ray cluster offers no shoal devices yet; start nodes with "
                            "shoal device resources (docs/ray.md)", field="model")
        memory: dict[str, float] = {}
        for node in nodes:
            known = node.memory_gb or self.device_memory_gb
            if known is None:
                raise SpecError(
                    f"the memory of a '{node.device_type}' device on Ray node "
                    f"{node.ray_id[:8]} is unknown, so a plan cannot be checked against it: "
                    f'start the node with --labels="{MEMORY_LABEL}=16" (GiB per device) or '
                    "give the service --slot-memory-gb", field="model")
            memory[node.device_type] = min(memory.get(node.device_type, known), known)
        peak = peak_tflops(nodes)
        return ClusterSpec(
            name="ray", device_types=[
                DeviceType(name=t, memory_gb=m, peak_tflops=peak[t]) for t, m in memory.items()],
            nodes=[NodeGroup(device_type=n.device_type, devices_per_node=n.capacity, count=1)
                   for n in nodes])

    def check_service(self, spec: JobSpec) -> None:
        check_service_spec(spec, self._state.device_types)

    def _service(self, spec: JobSpec) -> RayServeJob | RayStreamJob:
        if spec.kind == "stream":
            return RayStreamJob(spec, self.settings, registry=self.registry)
        return RayServeJob(spec, self.settings, registry=self.registry)

    def admit(self, spec: JobSpec, workdir: Path | None = None) -> JobLimits:
        if spec.kind != "train":
            return super().admit(spec, workdir)
        if not spec.command:
            raise SpecError(
                "the Ray backend runs a program: add e.g. "
                "command: [\"python\", \"train.py\"]", field="command",
            )
        types = self._state.device_types
        if spec.device_types and not set(spec.device_types) & set(types):
            raise SpecError(
                f"the Ray cluster offers {types}, the job allows {spec.device_types}",
                field="device_types",
            )
        if spec.model is not None:
            admitted = self.plan_model(spec)
            limits, planned = admitted.limits, admitted.models
        else:
            limits, planned = self.base_limits(spec), None
        self.jobs[spec.name] = self._job(spec, Path(workdir or self.pending_workdir or Path.cwd()),
                                         limits, planned)
        return limits

    def base_limits(self, spec: JobSpec) -> JobLimits:
        """The local backend's limits, with replicas bounded by the cluster's devices of the
        job's types (when the spec sets no bound)."""
        limits = super().base_limits(spec)
        return replace(limits, max_replicas=spec.max_replicas or self._capacity(spec))

    def _job(self, spec: JobSpec, workdir: Path, limits: JobLimits,
             planned: Mapping[str, PlannedGoodput] | None = None) -> RayJob:
        allowed = [t for t in self._state.device_types
                   if not spec.device_types or t in spec.device_types]
        model = JobModel.for_spec(allowed[0] if allowed else "unknown", spec, planned)
        model.type_peaks = peak_tflops(self.registry.nodes)
        return RayJob(spec, workdir, limits, self.settings, model, registry=self.registry)

    def adopt(self, spec: JobSpec, workdir: Path, limits: JobLimits) -> RayJob:  # type: ignore[override]
        """A job of a previous service: its actors ended with that service; it starts again
        from its last checkpoint once the scheduler places it."""
        planned = self.plan_model(spec).models if spec.model else None
        job = self._job(spec, workdir, limits, planned)
        job.adopt(self.now())
        self.jobs[spec.name] = job
        return job

    def close(self) -> None:
        self.prober.close()
        for job in self.jobs.values():
            if isinstance(job, RayJob):
                job._release()
        for service in self.services.values():
            service.stop()
        connect.disconnect()
