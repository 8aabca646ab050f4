"""Throughput of a job that declares its architecture: the best parallel plan per allocation.

A job that names its model (``JobSpec.model``) needs no measured profile: for ``K`` devices of a
type, spread over nodes, the planner (:mod:`shoal.perf.parallel`) gives the fastest plan that
fits the devices' memory and its step time. :class:`PlannedGoodput` answers the questions the
policies ask a job's goodput model (``optimize``, ``throughput``) from that plan, so an
allocation under which no plan fits has goodput 0 and drops out of every policy's choices, and
the others are ranked by the throughput of the plan each would run.

Three ways to pick the plan (``mode``):

* ``"search"``: the fastest plan over data / tensor / pipeline degrees, micro-batching,
  recomputation, ZeRO stage and offload (:func:`shoal.perf.parallel.best_plan`);
* ``"default"``: a fixed rule, as many clusters run large models today: pure data parallelism
  (no sharding, no recomputation) where it fits, else ZeRO-3 / FSDP full sharding with the least
  recomputation that fits, on all ``K`` devices; the micro-batch and accumulation are chosen as
  in the search (the fastest that fits);
* ``"data-parallel"``: the fastest plan without tensor or pipeline parallelism (ZeRO stages,
  offload, recomputation and micro-batching all allowed): what ``shoal.train.apply_plan``
  runs, so the local backend plans with it.

The global batch is the job's own and never changes, so goodput is throughput (samples/s).
Plans are cached per (model, device type, devices, devices per node, batch, mode, offload).
``offload=False`` leaves offloading to host memory out of every mode: on CPU devices the host
memory is the device memory, so offloading frees nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Literal

import numpy as np

from shoal.perf.goodput import BatchChoice
from shoal.perf.models import GPTConfig
from shoal.perf.parallel import Plan, SearchSpace, best_plan
from shoal.spec.cluster import DeviceType

PlanMode = Literal["search", "default", "data-parallel"]
PLAN_MODES: tuple[PlanMode, ...] = ("search", "default", "data-parallel")

_DATA_PARALLEL = SearchSpace(tensor_parallel=False, pipeline_parallel=False)
_PURE_DATA_PARALLEL = replace(_DATA_PARALLEL, zero_stages=(0,), offload=(False,),
                              recompute=("none",))
_FULLY_SHARDED = replace(_DATA_PARALLEL, zero_stages=(3,), offload=(False,))


def default_plan(model: GPTConfig, device: DeviceType, num_devices: int, devices_per_node: int,
                 global_batch: int) -> Plan | None:
    """Pure data parallel where it fits, else ZeRO-3 with the least recomputation that fits."""
    for space in (_PURE_DATA_PARALLEL, _FULLY_SHARDED):
        plan = best_plan(model, device, num_devices, devices_per_node, global_batch, space)
        if plan is not None:
            return plan
    return None


@lru_cache(maxsize=65536)
def planned(model: GPTConfig, device: DeviceType, num_devices: int, devices_per_node: int,
            global_batch: int, mode: PlanMode = "search", offload: bool = True) -> Plan | None:
    """The plan ``mode`` picks for ``num_devices`` devices, or None when none fits."""
    no_offload = {} if offload else {"offload": (False,)}
    if mode == "search":
        return best_plan(model, device, num_devices, devices_per_node, global_batch,
                         SearchSpace(**no_offload))
    if mode == "default":
        return default_plan(model, device, num_devices, devices_per_node, global_batch)
    if mode == "data-parallel":
        return best_plan(model, device, num_devices, devices_per_node, global_batch,
                         replace(_DATA_PARALLEL, **no_offload))
    raise ValueError(f"unknown plan mode {mode!r}; use one of {PLAN_MODES}")


def devices_per_node_of(num_nodes: int, num_replicas: int, node_capacity: int) -> int:
    """Devices per node the planner assumes: all on one node, else the even share per node."""
    if num_nodes <= 1:
        return max(1, min(num_replicas, node_capacity))
    return max(1, min(num_replicas // num_nodes, node_capacity))


def devices_per_node_on(per_node: Iterable[int], node_capacity: int) -> tuple[int, int, int]:
    """(nodes, replicas, devices per node the planner assumes) of devices spread as ``per_node``.

    Tensor-parallel and pipeline groups must fit the smallest share of a node, so an uneven
    spread (8 + 8 + 3) is planned as if every node held that smallest share.
    """
    counts = [int(c) for c in per_node if c > 0]
    replicas = sum(counts)
    if len(counts) <= 1:
        return len(counts), replicas, max(1, min(replicas, node_capacity))
    return len(counts), replicas, max(1, min(min(counts), node_capacity))


_SUMMARY_KEYS = ("dp", "tp", "pp", "virtual_stages", "micro_batch", "accumulation", "recompute",
                 "recompute_fraction", "zero_stage", "offload", "step_time_s")


def plan_summary(plan: Plan) -> dict[str, object]:
    """The layout and predictions of a plan, for reports (a compact :meth:`Plan.to_dict`)."""
    full = plan.to_dict()
    return {**{k: full[k] for k in _SUMMARY_KEYS},
            "memory_gib": plan.memory_bytes / 2**30, "samples_per_s": plan.throughput}


def describe_plan(summary: Mapping[str, Any]) -> str:
    """One line for people: a :func:`plan_summary`'s layout, knobs and predictions (the
    dashboard's ``planText`` writes the same)."""
    layout = [f"dp {summary['dp']}"]
    if summary.get("tp", 1) > 1:
        layout.append(f"tp {summary['tp']}")
    if summary.get("pp", 1) > 1:
        virtual = summary.get("virtual_stages", 1)
        layout.append(f"pp {summary['pp']}" + (f" ({virtual} virtual)" if virtual > 1 else ""))
    stage = summary.get("zero_stage", 0)
    parts = [" x ".join(layout), f"ZeRO-{stage}" if stage else "no sharding"]
    if summary.get("offload"):
        parts.append("offload")
    parts.append(f"micro-batch {summary['micro_batch']} x {summary['accumulation']}")
    recompute, fraction = summary.get("recompute", "none"), summary.get("recompute_fraction", 1)
    if recompute == "none":
        parts.append("no recompute")
    else:
        parts.append(f"{recompute} recompute"
                     + (f" on {fraction:.0%} of layers" if fraction < 1 else ""))
    memory = summary.get("memory_gib")
    if memory is not None:
        shown = f"{memory:.1f} GiB" if memory >= 1 else f"{memory * 1024:.1f} MiB"
        parts.append(f"{shown} per device")
    step = summary.get("step_time_s")
    if step is not None:
        parts.append(f"{_duration(step)} per step (predicted)")
    return " · ".join(parts)


def _duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.1f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.1f} µs"


@dataclass(eq=False)
class PlannedGoodput:
    """Goodput of a model-declared job on one device type, from the plan of each allocation.

    Duck-types :class:`shoal.perf.goodput.GoodputModel` where policies use it: ``optimize``
    returns, per (nodes, replicas), the plan's samples/s as goodput (0 where no plan fits), its
    micro-batch as ``atomic_bsz`` and its micro-batches per step minus one as ``accum_steps``.
    """

    model: GPTConfig
    device: DeviceType
    node_capacity: int
    global_batch: int
    mode: PlanMode = "search"
    offload: bool = True  # whether plans may offload to host memory (not on CPU devices)
    _memo: dict[tuple[int, int], Plan | None] = field(default_factory=dict, repr=False)

    @property
    def init_batch_size(self) -> int:
        return self.global_batch

    @property
    def max_batch_size(self) -> int:
        return self.global_batch

    def plan(self, num_nodes: int, num_replicas: int) -> Plan | None:
        """The plan for ``num_replicas`` devices spread evenly over ``num_nodes`` nodes."""
        nodes, replicas = int(num_nodes), int(num_replicas)
        return self._plan(replicas, devices_per_node_of(nodes, replicas, self.node_capacity))

    def plan_on(self, per_node: Iterable[int]) -> Plan | None:
        """The plan for devices spread over nodes as ``per_node`` (devices on each node)."""
        _, replicas, dpn = devices_per_node_on(per_node, self.node_capacity)
        return self._plan(replicas, dpn)

    def _plan(self, replicas: int, devices_per_node: int) -> Plan | None:
        key = (replicas, devices_per_node)
        if key not in self._memo:
            self._memo[key] = None if replicas < 1 else planned(
                self.model, self.device, replicas, devices_per_node, self.global_batch,
                self.mode, self.offload)
        return self._memo[key]

    def _per_pair(self, num_nodes, num_replicas):
        shape = np.broadcast(num_nodes, num_replicas).shape
        nodes = np.broadcast_to(num_nodes, shape).ravel()
        replicas = np.broadcast_to(num_replicas, shape).ravel()
        plans = [self.plan(n, r) for n, r in zip(nodes.tolist(), replicas.tolist(), strict=True)]
        return shape, plans

    def optimize(self, num_nodes, num_replicas, accumulation: bool = True) -> BatchChoice:
        scalar = np.isscalar(num_nodes) and np.isscalar(num_replicas)
        shape, plans = self._per_pair(num_nodes, num_replicas)
        goodput = np.array([p.throughput if p else 0.0 for p in plans], dtype=float)
        atomic = np.array([p.config.micro_batch if p else 0 for p in plans], dtype=int)
        accum = np.array([p.config.num_microbatches - 1 if p else 0 for p in plans], dtype=int)
        if scalar:
            return BatchChoice(float(goodput[0]), int(atomic[0]), int(accum[0]))
        return BatchChoice(goodput.reshape(shape), atomic.reshape(shape), accum.reshape(shape))

    def throughput(self, num_nodes, num_replicas, atomic_bsz=None, accum_steps=None) -> np.ndarray:
        """Samples/s of each allocation's plan (the plan fixes micro-batch and accumulation)."""
        shape, plans = self._per_pair(num_nodes, num_replicas)
        values = np.array([p.throughput if p else 0.0 for p in plans], dtype=float)
        return values.reshape(shape)

    evaluate = throughput

    def min_replicas(self, counts: list[int] | range) -> int | None:
        """The fewest devices among ``counts`` (packed onto nodes) under which a plan fits."""
        for count in sorted(counts):
            nodes = -(-count // self.node_capacity)
            if self.plan(nodes, count) is not None:
                return count
        return None


PlacementCheck = Callable[[str, Iterable[int]], bool]


def placement_check(models: Mapping[str, object]) -> PlacementCheck | None:
    """For a job whose goodput models plan (:class:`PlannedGoodput`): a test of whether a plan
    fits ``per_node`` devices of a device type (False for a type the job has no model of).
    None for jobs with measured models, which run on any allocation.

    Policies that place jobs themselves (Pollux) use it to skip allocations no plan fits.
    """
    if not any(isinstance(m, PlannedGoodput) for m in models.values()):
        return None

    def fits(device_type: str, per_node: Iterable[int]) -> bool:
        model = models.get(device_type)
        return isinstance(model, PlannedGoodput) and model.plan_on(per_node) is not None

    return fits
