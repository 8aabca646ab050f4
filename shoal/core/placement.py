"""Placement: turn a policy's grants into concrete devices on nodes.

Rules, in order:
1. A grant that pins ``nodes`` gets exactly those (checked against capacity).
2. A running job whose grant keeps its device count and type stays where it is.
3. Every other grant, in the order the policy listed them, is packed greedily onto the nodes
   of its type with the most free devices (ties: lowest node id), so replicas land on as few
   nodes as possible. A grant without a type goes to its current type, else to the first type
   (in cluster order) where it fits. A grant that no longer fits is left unplaced.
"""

from __future__ import annotations

from collections.abc import Mapping

from shoal.core.types import Allocation, ClusterState, Decision, Grant


class PlacementError(ValueError):
    pass


def _free_devices(cluster: ClusterState) -> dict[int, int]:
    return {n.node_id: n.capacity for n in cluster.nodes}


def _type_of(cluster: ClusterState) -> dict[int, str]:
    return {n.node_id: n.device_type for n in cluster.nodes}


def _candidate_types(grant: Grant, cluster: ClusterState,
                     current: Allocation | None) -> list[str]:
    if grant.device_type is not None:
        return [grant.device_type]
    preferred = [current.device_type] if current is not None else []
    return list(dict.fromkeys([*preferred, *cluster.device_types]))


def pack(free: dict[int, int], node_type: Mapping[int, str], device_type: str,
         replicas: int) -> tuple[int, ...] | None:
    """Take ``replicas`` devices, most-free node first; None if they do not fit."""
    candidates = [n for n, f in free.items() if node_type[n] == device_type and f > 0]
    if sum(free[n] for n in candidates) < replicas:
        return None
    chosen: list[int] = []
    while len(chosen) < replicas:
        node = max(candidates, key=lambda n: (free[n], -n))
        take = min(free[node], replicas - len(chosen))
        chosen.extend([node] * take)
        free[node] -= take
    return tuple(chosen)


def place(
    decision: Decision, cluster: ClusterState, current: Mapping[str, Allocation]
) -> dict[str, Allocation]:
    free = _free_devices(cluster)
    node_type = _type_of(cluster)
    result: dict[str, Allocation] = {}

    def reserve(name: str, alloc: Allocation) -> None:
        for node, count in alloc.per_node().items():
            if node not in free or node_type[node] != alloc.device_type:
                raise PlacementError(f"{name}: node {node} has no {alloc.device_type} devices")
            if free[node] < count:
                raise PlacementError(f"{name}: node {node} over-committed")
            free[node] -= count
        result[name] = alloc

    for name, grant in decision.items():
        if grant.replicas <= 0 or grant.nodes is None:
            continue
        if len(grant.nodes) != grant.replicas:
            raise PlacementError(f"{name}: {len(grant.nodes)} nodes for {grant.replicas} replicas")
        dtype = grant.device_type or node_type[grant.nodes[0]]
        reserve(name, Allocation(dtype, tuple(grant.nodes)))

    for name, grant in decision.items():
        old = current.get(name)
        if grant.replicas <= 0 or grant.nodes is not None or old is None:
            continue
        if old.num_replicas == grant.replicas and grant.device_type in (None, old.device_type):
            reserve(name, old)

    for name, grant in decision.items():
        if grant.replicas <= 0 or name in result:
            continue
        for dtype in _candidate_types(grant, cluster, current.get(name)):
            nodes = pack(free, node_type, dtype, grant.replicas)
            if nodes is not None:
                result[name] = Allocation(dtype, nodes)
                break
    return result
