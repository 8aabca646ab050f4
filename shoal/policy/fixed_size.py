"""The size a fixed-size baseline gives a job on a cluster of one or several device types."""

from __future__ import annotations

from shoal.core.types import ClusterState, JobView


def largest_type_capacity(job: JobView, cluster: ClusterState) -> int:
    """Devices of the largest device type ``job`` may use (a job runs on one type)."""
    allowed = job.spec.device_types or cluster.device_types
    return max((cluster.capacity(t) for t in allowed), default=0)


def fitted_size(job: JobView, cluster: ClusterState, want: int) -> int:
    """``want`` replicas, capped at the largest type the job may use unless it is rigid: a
    job larger than every type could never be placed, and a policy that keeps granting it
    devices would wait on it for ever."""
    if job.spec.rigid:
        return want
    return max(1, min(want, largest_type_capacity(job, cluster)))
