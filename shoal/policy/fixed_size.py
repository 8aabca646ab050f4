"""The size a fixed-size baseline gives a job on a cluster of one or several device types."""

from __future__ import annotations

from collections.abc import Sequence

from shoal.core.types import ClusterState, JobView


def allowed_types(job: JobView, types: Sequence[str]) -> list[str]:
    """Those of ``types`` that ``job`` may run on (all of them unless its spec names some)."""
    return [t for t in types if not job.spec.device_types or t in job.spec.device_types]


def largest_type_capacity(job: JobView, cluster: ClusterState) -> int:
    """Devices of the largest device type ``job`` may use (a job runs on one type)."""
    return max((cluster.capacity(t) for t in allowed_types(job, cluster.device_types)),
               default=0)


def fitted_size(job: JobView, cluster: ClusterState, want: int) -> int:
    """``want`` replicas, capped at the largest type the job may use unless it is rigid: a
    job larger than every type could never be placed, and a policy that keeps granting it
    devices would wait on it for ever."""
    if job.spec.rigid:
        return want
    return max(1, min(want, largest_type_capacity(job, cluster)))


def requested_size(job: JobView, cluster: ClusterState) -> int:
    """The size a fixed-size baseline runs ``job`` at: its submitted replicas within its
    replica bound, capped at the largest type it may use (see :func:`fitted_size`)."""
    return fitted_size(job, cluster, min(job.spec.num_replicas, job.limits.max_replicas))


class FreeByType:
    """Free devices per device type, for baselines that give each job devices of one type.

    A count over the whole cluster would grant a job devices that no single type holds, and
    the grant could not be placed while the policy took the job for running.
    """

    def __init__(self, cluster: ClusterState):
        self._types = cluster.device_types
        self.free = {t: cluster.capacity(t) for t in self._types}

    def hold(self, job: JobView) -> None:
        """Count a running job's devices as taken (on a type the cluster still has)."""
        if job.allocation is not None and job.allocation.device_type in self.free:
            self.free[job.allocation.device_type] -= job.allocation.num_replicas

    def take(self, job: JobView, replicas: int) -> str | None:
        """The type ``job`` gets ``replicas`` devices of (its current type first, then the
        cluster's order, as placement tries them), taking them; None if no type it may use
        has that many free."""
        current = [job.allocation.device_type] if job.allocation is not None else []
        for device_type in allowed_types(job, list(dict.fromkeys([*current, *self._types]))):
            if self.free.get(device_type, 0) >= replicas:
                self.free[device_type] -= replicas
                return device_type
        return None
