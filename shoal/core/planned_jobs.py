"""Admission of a training job that declares its model: which allocations a plan fits.

A job whose spec names its architecture (``JobSpec.model``) needs no measured profile. Per
device type it gets a :class:`~shoal.perf.planned.PlannedGoodput`: for each allocation, the
fastest parallel plan that fits the devices' memory, and its samples per second. The simulator
and the local backend admit such a job here, so a job no allocation of the cluster can hold is
refused at submission with the same message on both.
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal.core.types import JobLimits
from shoal.perf.catalog import parse_model
from shoal.perf.models import GPTConfig
from shoal.perf.planned import PlanMode, PlannedGoodput
from shoal.spec.cluster import ClusterSpec
from shoal.spec.errors import SpecError
from shoal.spec.job import JobSpec

_PLAN_KIND = {"search": "plan", "default": "default plan",
              "data-parallel": "data-parallel plan (no tensor or pipeline parallelism)"}


def allocation_shapes(node_capacity: int, num_nodes: int) -> list[int]:
    """Device counts of the shapes policies allocate: powers of two within a node, then whole
    nodes."""
    counts, size = [], 1
    while size < node_capacity:
        counts.append(size)
        size *= 2
    return [*counts, *(n * node_capacity for n in range(1, num_nodes + 1))]


@dataclass(frozen=True)
class PlannedAdmission:
    """What the backends need of an admitted model-declared job."""

    model: GPTConfig
    global_batch: int
    target_tokens: int
    models: dict[str, PlannedGoodput]  # per allowed device type (all-zero where nothing fits)
    capacity: dict[str, int]  # devices per allowed type
    limits: JobLimits


def admit_model(spec: JobSpec, cluster: ClusterSpec, mode: PlanMode = "search",
                offload: bool = True) -> PlannedAdmission:
    """The planned models and limits of ``spec``; SpecError when no allocation fits.

    ``offload``: whether plans may offload to host memory (see :mod:`shoal.perf.planned`)."""
    assert spec.model is not None
    model = parse_model(spec.model)
    global_batch = spec.batch_size
    target_tokens = spec.target_tokens
    if global_batch is None or target_tokens is None:  # JobSpec validation requires both
        raise SpecError("a job that declares a model needs batch_size and target_tokens",
                        field="model")
    per_node: dict[str, int] = {}
    capacity: dict[str, int] = {}
    for node in cluster.expand():
        per_node[node.device_type] = max(per_node.get(node.device_type, 0), node.capacity)
        capacity[node.device_type] = capacity.get(node.device_type, 0) + node.capacity
    allowed = [t for t in per_node if not spec.device_types or t in spec.device_types]
    if not allowed:
        raise SpecError(f"none of {spec.device_types} is in the cluster; types: "
                        f"{sorted(per_node)}", field="device_types")
    models = {t: PlannedGoodput(model, cluster.device_type(t), per_node[t], global_batch, mode,
                                offload)
              for t in allowed}
    fits = {t: m.min_replicas(allocation_shapes(per_node[t], capacity[t] // per_node[t]))
            for t, m in models.items()}
    if all(count is None for count in fits.values()):
        gib = model.num_parameters() * 16 / 2**30
        raise SpecError(
            f"no {_PLAN_KIND[mode]} of {spec.model} "
            f"({model.num_parameters() / 1e9:.1f}B parameters, {gib:.0f} GiB of mixed-precision "
            f"Adam state) fits any allocation of {', '.join(allowed)} on this cluster with "
            f"global batch {global_batch}; use a cluster with more or larger devices, or a "
            "global batch divisible by more device counts",
            field="model",
        )
    smallest = min(count for count in fits.values() if count is not None)
    if spec.max_replicas is not None and spec.max_replicas < smallest:
        raise SpecError(f"{spec.model} needs at least {smallest} devices on this cluster for a "
                        f"plan to fit; raise max_replicas to {smallest} or more",
                        field="max_replicas")
    if spec.rigid:
        n = spec.num_replicas
        if not any(n <= capacity[t] and m.plan(-(-n // m.node_capacity), n) is not None
                   for t, m in models.items()):
            raise SpecError(f"no plan of {spec.model} fits {n} devices of {', '.join(allowed)}; "
                            f"a rigid job needs a size that fits, e.g. {smallest}",
                            field="num_replicas")
    # Types where nothing fits keep their (all-zero) model: a policy must not borrow another
    # type's model for them.
    largest = max(capacity[t] for t in models if fits[t] is not None)
    caps = [largest] + ([spec.max_replicas] if spec.max_replicas else [])
    limits = JobLimits(init_batch_size=global_batch, max_batch_size=global_batch,
                       min_local_bsz=1, max_local_bsz=global_batch,
                       max_replicas=min(caps), fixed_batch=global_batch)
    return PlannedAdmission(model, global_batch, target_tokens, models,
                            {t: capacity[t] for t in models}, limits)
