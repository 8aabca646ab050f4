"""A job that declares its model on the Ray backend: planned under the devices' memory, trained
under the plan of the allocation Ray runs it on (tests/ray/conftest.py's two loopback nodes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.local.test_planned_jobs import EXAMPLE, ONE_TOO_SMALL_GB
from tests.ray.cluster import LoopbackCluster
from tests.service.helpers import REPO, all_done, running_service, wait_until

pytestmark = pytest.mark.slow


def test_the_example_spans_both_nodes_under_the_two_device_plan(
        ray_cluster: LoopbackCluster, tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    spec = EXAMPLE.read_text() + f"workdir: {REPO}\n"
    with running_service(tmp_path / "unknown", address=ray_cluster.address, backend="ray",
                         checkpoint_dir=str(checkpoints), policy="shoal") as service:
        # No node says how much memory its devices have: nothing to plan against.
        refused = service.submit(spec)
        assert refused.status_code == 422, refused.text
        detail = refused.json()["detail"]
        assert detail["field"] == "model" and "shoal.io/device-memory-gb" in detail["message"]
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
