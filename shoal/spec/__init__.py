"""Validated descriptions of clusters and jobs."""

from shoal.spec.cluster import (
    ClusterSpec,
    DeviceType,
    NodeGroup,
    NodeInfo,
    load_cluster,
    parse_cluster,
    preset_names,
)
from shoal.spec.errors import SpecError
from shoal.spec.job import JobSpec, load_job_yaml, load_workload_csv, parse_job

__all__ = [
    "ClusterSpec",
    "DeviceType",
    "JobSpec",
    "NodeGroup",
    "NodeInfo",
    "SpecError",
    "load_cluster",
    "load_job_yaml",
    "load_workload_csv",
    "parse_cluster",
    "parse_job",
    "preset_names",
]
