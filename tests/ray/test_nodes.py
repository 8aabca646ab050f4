"""How Ray nodes map to shoal's device pool (entries shaped like ``ray.nodes()``)."""

from __future__ import annotations

from typing import Any

from shoal.backends.ray.nodes import NodeRegistry, offers


def node(ray_id: str, address: str, resources: dict[str, float],
         labels: dict[str, str] | None = None, alive: bool = True) -> dict[str, Any]:
    return {"NodeID": ray_id, "NodeManagerAddress": address, "Alive": alive,
            "Resources": {"CPU": 8.0, "memory": 1e9, f"node:{address}": 1.0, **resources},
            "Labels": {"ray.io/node-id": ray_id, **(labels or {})}}


def test_custom_resources_one_shoal_node_per_type() -> None:
    got = offers(node("a", "10.0.0.1", {"shoal:t4": 4.0, "shoal:cpu": 2.0, "other": 3.0}))
    assert [(o.device_type, o.capacity, dict(o.bundle)) for o in got] == [
        ("cpu", 2, {"shoal:cpu": 1.0}), ("t4", 4, {"shoal:t4": 1.0})]


def test_label_names_the_type_of_gpus_or_cpu_slots() -> None:
    gpu = offers(node("a", "10.0.0.1", {"GPU": 8.0, "accelerator_type:A100": 1.0},
                      {"shoal.io/device-type": "a100-80g"}))
    assert [(o.device_type, o.capacity, dict(o.bundle)) for o in gpu] == [
        ("a100-80g", 8, {"GPU": 1.0})]
    cpu = offers(node("b", "10.0.0.2", {}, {"shoal.io/device-type": "xeon"}), cores_per_slot=3)
    assert [(o.device_type, o.capacity, dict(o.bundle)) for o in cpu] == [
        ("xeon", 2, {"CPU": 3.0})]


def test_gpus_take_rays_accelerator_type() -> None:
    got = offers(node("a", "10.0.0.1", {"GPU": 4.0, "accelerator_type:T4": 1.0}))
    assert [(o.device_type, o.capacity, dict(o.bundle)) for o in got] == [
        ("t4", 4, {"GPU": 1.0})]


def test_nodes_without_devices_offer_none() -> None:
    assert offers(node("head", "10.0.0.1", {})) == []
    assert offers(node("a", "10.0.0.1", {"shoal:BAD TYPE": 2.0, "shoal:t4": 0.5})) == []


def test_registry_ids_are_stable_and_never_reused() -> None:
    registry = NodeRegistry()
    first = registry.update([node("b", "10.0.0.2", {"shoal:t4": 2.0}),
                             node("a", "10.0.0.1", {"shoal:t4": 1.0, "shoal:v100": 1.0})])
    assert [(n.node_id, n.address, n.device_type) for n in first] == [
        (0, "10.0.0.1", "t4"), (1, "10.0.0.1", "v100"), (2, "10.0.0.2", "t4")]
    # Node b leaves, node c joins: a keeps its ids, c gets a fresh one, b's id is not reused.
    second = registry.update([node("a", "10.0.0.1", {"shoal:t4": 1.0, "shoal:v100": 1.0}),
                              node("b", "10.0.0.2", {"shoal:t4": 2.0}, alive=False),
                              node("c", "10.0.0.2", {"shoal:t4": 2.0})])
    assert [(n.node_id, n.ray_id) for n in second] == [(0, "a"), (1, "a"), (3, "c")]
    assert registry.get(2) is None and registry.alive([0, 1, 3]) and not registry.alive([2])


def test_the_memory_label_gives_each_device_its_memory() -> None:
    registry = NodeRegistry()
    nodes = registry.update([
        node("a", "10.0.0.1", {"shoal:t4": 4.0}, {"shoal.io/device-memory-gb": "15.5"}),
        node("b", "10.0.0.2", {"shoal:t4": 2.0}, {"shoal.io/device-memory-gb": "lots"}),
        node("c", "10.0.0.3", {"shoal:t4": 2.0})])
    assert [(n.ray_id, n.memory_gb) for n in nodes] == [("a", 15.5), ("b", None), ("c", None)]
    assert not nodes[0].gpu
    gpu = registry.update([node("d", "10.0.0.4", {"GPU": 1.0, "accelerator_type:T4": 1.0})])
    assert gpu[0].gpu
