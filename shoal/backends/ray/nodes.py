"""The device pool of a Ray cluster: which nodes offer which shoal device types.

A Ray node offers shoal devices in one of three ways (first match wins, per node):

1. Custom resources named ``shoal:<type>``: ``ray start --resources='{"shoal:t4": 4}'`` offers
   4 devices of type ``t4``. A node may offer several types this way; each type on a node
   becomes one shoal node. A replica reserves one unit of the resource.
2. The label ``shoal.io/device-type=<type>``: the node's GPUs (``GPU`` resource), or without
   GPUs its CPUs in slots of ``cores_per_slot``, are devices of that type. A replica reserves
   one GPU (Ray then sets ``CUDA_VISIBLE_DEVICES`` for it) or ``cores_per_slot`` CPUs.
3. GPUs with Ray's own ``accelerator_type:<X>`` resource: ``X`` in lower case is the type.

Other nodes (e.g. a CPU-only head node of a GPU cluster) offer no shoal devices. The label
``shoal.io/device-memory-gb=<GiB>`` gives the memory of each device a node offers: the bound a
job that declares its model is planned under. Shoal node ids
are small integers given in the order nodes are first seen and never reused, so an allocation
that names a node that left the cluster can never land on a newcomer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

RESOURCE_PREFIX = "shoal:"
TYPE_LABEL = "shoal.io/device-type"
MEMORY_LABEL = "shoal.io/device-memory-gb"
TFLOPS_LABEL = "shoal.io/device-tflops"
NODE_ID_LABEL = "ray.io/node-id"  # set by Ray on every node
_ACCELERATOR_PREFIX = "accelerator_type:"
_TYPE_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


@dataclass(frozen=True, slots=True)
class RayNode:
    """Devices of one type on one Ray node: one shoal node."""

    node_id: int  # shoal's id
    ray_id: str  # Ray's NodeID (hex)
    address: str  # the node's IP address (rank 0's node is the job's MASTER_ADDR)
    device_type: str
    capacity: int
    bundle: Mapping[str, float]  # Ray resources one replica reserves
    memory_gb: float | None = None  # per device, from the node's MEMORY_LABEL
    peak_tflops: float | None = None  # per device, from the node's TFLOPS_LABEL

    @property
    def gpu(self) -> bool:
        return "GPU" in self.bundle


@dataclass(frozen=True, slots=True)
class Offer:
    """What a Ray node offers before it has shoal ids: (type, count, bundle)."""

    device_type: str
    capacity: int
    bundle: Mapping[str, float]


def device_memory_gb(node: Mapping[str, Any]) -> float | None:
    """The node's ``MEMORY_LABEL`` in GiB; None when absent or not a positive number."""
    return _positive_label(node, MEMORY_LABEL)


def device_tflops(node: Mapping[str, Any]) -> float | None:
    """The node's ``TFLOPS_LABEL`` (peak TFLOP/s per device); None when absent or invalid."""
    return _positive_label(node, TFLOPS_LABEL)


def _positive_label(node: Mapping[str, Any], label: str) -> float | None:
    raw = str((node.get("Labels") or {}).get(label, "")).strip()
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if value > 0 else None


def offers(node: Mapping[str, Any], cores_per_slot: int = 1) -> list[Offer]:
    """The shoal devices a node (an entry of ``ray.nodes()``) offers, by the rules above."""
    resources: Mapping[str, float] = node.get("Resources") or {}
    labels: Mapping[str, str] = node.get("Labels") or {}
    custom = [
        Offer(key[len(RESOURCE_PREFIX):], int(value), {key: 1.0})
        for key, value in sorted(resources.items())
        if key.startswith(RESOURCE_PREFIX) and int(value) >= 1
        and _TYPE_NAME.match(key[len(RESOURCE_PREFIX):])
    ]
    if custom:
        return custom
    gpus = int(resources.get("GPU", 0))
    labelled = labels.get(TYPE_LABEL, "").strip().lower()
    if labelled and _TYPE_NAME.match(labelled):
        if gpus >= 1:
            return [Offer(labelled, gpus, {"GPU": 1.0})]
        slots = int(resources.get("CPU", 0)) // max(cores_per_slot, 1)
        return [Offer(labelled, slots, {"CPU": float(cores_per_slot)})] if slots >= 1 else []
    if gpus >= 1:
        for key in sorted(resources):
            name = key[len(_ACCELERATOR_PREFIX):].lower()
            if key.startswith(_ACCELERATOR_PREFIX) and _TYPE_NAME.match(name):
                return [Offer(name, gpus, {"GPU": 1.0})]
    return []


@dataclass
class NodeRegistry:
    """Shoal nodes of the live Ray nodes, with ids stable across refreshes."""

    cores_per_slot: int = 1
    _ids: dict[tuple[str, str], int] = field(default_factory=dict)  # (ray id, type) -> id
    nodes: tuple[RayNode, ...] = ()

    def update(self, ray_nodes: Iterable[Mapping[str, Any]]) -> tuple[RayNode, ...]:
        """Refresh from ``ray.nodes()``; dead nodes drop out, new ones get fresh ids."""
        out: list[RayNode] = []
        order = sorted(ray_nodes, key=lambda n: (str(n.get("NodeManagerAddress", "")),
                                                 str(n.get("NodeID", ""))))
        for node in order:  # new nodes are numbered by address: stable, readable ids
            if not node.get("Alive"):
                continue
            ray_id = str(node["NodeID"])
            address = str(node.get("NodeManagerAddress", ""))
            memory, tflops = device_memory_gb(node), device_tflops(node)
            for offer in offers(node, self.cores_per_slot):
                key = (ray_id, offer.device_type)
                if key not in self._ids:
                    self._ids[key] = len(self._ids)
                out.append(RayNode(self._ids[key], ray_id, address, offer.device_type,
                                   offer.capacity, dict(offer.bundle), memory, tflops))
        self.nodes = tuple(sorted(out, key=lambda n: n.node_id))
        return self.nodes

    def get(self, node_id: int) -> RayNode | None:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        return None

    def alive(self, node_ids: Iterable[int]) -> bool:
        known = {n.node_id for n in self.nodes}
        return all(n in known for n in node_ids)
