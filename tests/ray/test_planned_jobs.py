"""A job that declares its model on the Ray backend: planned under the devices' memory, trained
under the plan of the allocation Ray runs it on (tests/ray/conftest.py's two loopback nodes)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from shoal.backends.ray.backend import RayBackend
from shoal.backends.ray.nodes import NodeRegistry
from shoal.spec.errors import SpecError
from tests.local.test_planned_jobs import EXAMPLE, ONE_TOO_SMALL_GB
from tests.ray.cluster import LoopbackCluster
from tests.service.helpers import REPO, all_done, running_service, wait_until


@pytest.mark.slow
def test_the_example_spans_both_nodes_under_the_two_device_plan(
        ray_cluster: LoopbackCluster, tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    spec = EXAMPLE.read_text() + f"workdir: {REPO}\n"
    with running_service(tmp_path / "home", address=ray_cluster.address, backend="ray",
                         checkpoint_dir=str(checkpoints), policy="shoal",
                         slot_memory_gb=ONE_TOO_SMALL_GB) as service:
        response = service.submit(spec)
        assert response.status_code == 201, response.text
        wait_until(lambda: all_done(service, ["gpt-planned"]), 180, "the job to finish",
                   service.diagnostics)
        described = service.job("gpt-planned")
        assert described["state"] == "finished", service.diagnostics()
        log = service.log_text("gpt-planned")
    result = json.loads((checkpoints / "gpt-planned" / "result.json").read_text())
    # One cpu device per node and no plan fits one: the job ran on both nodes, sharded.
    assert described["plan"]["dp"] == result["world_size"] == 2
    assert result["plan"]["zero_stage"] > 0 and result["runs"][0]["sharding"] != "none"
    assert "127.0.0.2" in log and "127.0.0.3" in log
    assert result["steps"] == 20 and result["losses"][-1] < 0.5 * result["losses"][0]


def _nodes(labels: dict[str, str] | None = None) -> NodeRegistry:
    registry = NodeRegistry()
    registry.update([
        {"NodeID": "a", "NodeManagerAddress": "10.0.0.1", "Alive": True,
         "Resources": {"shoal:t4": 4.0}, "Labels": {"shoal.io/device-memory-gb": "16"}},
        {"NodeID": "b", "NodeManagerAddress": "10.0.0.2", "Alive": True,
         "Resources": {"shoal:t4": 2.0, "shoal:cpu": 2.0}, "Labels": labels or {}}])
    return registry


def test_plans_are_bounded_by_the_smallest_memory_of_each_type() -> None:
    # cluster_spec reads only the registry and the configured memory (no Ray needed).
    cluster = RayBackend.cluster_spec(SimpleNamespace(  # type: ignore[arg-type]
        registry=_nodes({"shoal.io/device-memory-gb": "12"}), device_memory_gb=None))
    assert {t.name: t.memory_gb for t in cluster.device_types} == {"t4": 12.0, "cpu": 12.0}
    assert sorted((g.device_type, g.devices_per_node) for g in cluster.nodes) == [
        ("cpu", 2), ("t4", 2), ("t4", 4)]
    configured = RayBackend.cluster_spec(SimpleNamespace(  # type: ignore[arg-type]
        registry=_nodes(), device_memory_gb=8.0))
    assert {t.name: t.memory_gb for t in configured.device_types} == {"t4": 8.0, "cpu": 8.0}
    with pytest.raises(SpecError) as error:
        RayBackend.cluster_spec(SimpleNamespace(  # type: ignore[arg-type]
            registry=_nodes(), device_memory_gb=None))
    assert error.value.field == "model" and "shoal.io/device-memory-gb=16" in str(error.value)


def test_each_type_is_planned_at_its_slowest_labelled_rate() -> None:
    registry = NodeRegistry()
    registry.update([
        {"NodeID": "a", "NodeManagerAddress": "10.0.0.1", "Alive": True,
         "Resources": {"shoal:t4": 4.0, "shoal:cpu": 2.0},
         "Labels": {"shoal.io/device-memory-gb": "16", "shoal.io/device-tflops": "60"}},
        {"NodeID": "b", "NodeManagerAddress": "10.0.0.2", "Alive": True,
         "Resources": {"shoal:t4": 2.0, "shoal:a100": 8.0},
         "Labels": {"shoal.io/device-memory-gb": "16", "shoal.io/device-tflops": "oops"}}])
    cluster = RayBackend.cluster_spec(SimpleNamespace(  # type: ignore[arg-type]
        registry=registry, device_memory_gb=None))
    peaks = {t.name: t.peak_tflops for t in cluster.device_types}
    # Labelled: the label (a bad one is ignored); unlabelled known GPU: its data-sheet peak.
    assert peaks == {"t4": 60.0, "cpu": 60.0, "a100": 312.0}
