"""The replica environment on Ray: the local backend's contract, made node-aware."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ray")

from shoal.backends.local.devices import DevicePool
from shoal.backends.local.model import JobModel
from shoal.backends.ray.backend import RayBackend
from shoal.backends.ray.job import RayJob, RaySettings
from shoal.backends.ray.nodes import RayNode
from shoal.core.types import Allocation, JobLimits
from shoal.spec.job import JobSpec


def _job(tmp_path: Path, checkpoint_root: Path | None) -> RayJob:
    spec = JobSpec(name="j", application="tiny", batch_size=16, command=["python", "t.py"])
    settings = RaySettings(home=tmp_path, pool=DevicePool("cpu", 4, 2),
                           scheduler_url="http://10.0.0.1:8000", checkpoint_root=checkpoint_root)
    limits = JobLimits(init_batch_size=16, max_batch_size=16, min_local_bsz=1,
                       max_local_bsz=16, max_replicas=4)
    return RayJob(spec, tmp_path, limits, settings, JobModel("t4", None))


def _node(node_id: int, ray_id: str, address: str) -> RayNode:
    return RayNode(node_id, ray_id, address, "t4", 2, {"shoal:t4": 1.0})


def test_ranks_count_per_node_and_rank_zero_is_master(tmp_path: Path) -> None:
    job = _job(tmp_path, tmp_path / "shared")
    hosts = [_node(0, "a", "10.0.0.2"), _node(0, "a", "10.0.0.2"), _node(1, "b", "10.0.0.3")]
    alloc = Allocation("t4", (0, 0, 1))
    envs = [job.environment(alloc, hosts, rank) for rank in range(3)]
    assert [(e["RANK"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) for e in envs] == [
        ("0", "0", "2"), ("1", "1", "2"), ("2", "0", "1")]
    for env in envs:
        assert env["WORLD_SIZE"] == "3" and env["SHOAL_NUM_NODES"] == "2"
        assert env["MASTER_ADDR"] == "10.0.0.2" and "MASTER_PORT" not in env
        assert env["SHOAL_CHECKPOINT_DIR"] == str(tmp_path / "shared" / "j")
        assert env["SHOAL_SCHEDULER_URL"] == "http://10.0.0.1:8000"
        assert env["OMP_NUM_THREADS"] == "2" and env["SHOAL_JOB"] == "j"
        assert env["SHOAL_DEVICE_TYPE"] == alloc.device_type
        assert "GLOO_SOCKET_IFNAME" not in env  # a real network: each node's own setting


def test_gpu_replicas_keep_the_gpu_ray_gives_their_actor(tmp_path: Path) -> None:
    job = _job(tmp_path, None)
    job.settings = RaySettings(home=tmp_path, pool=DevicePool("gpu", 2, 1, gpu_ids=(0, 1)))
    job.slot_ids = (1,)
    alloc = Allocation("gpu", (0, 1))
    hosts = [_node(0, "a", "127.0.0.2"), _node(1, "b", "127.0.0.3")]
    assert "CUDA_VISIBLE_DEVICES" in job.contract_environment(alloc, 0, 29500)
    assert "CUDA_VISIBLE_DEVICES" not in job.environment(alloc, hosts, 0)


def test_loopback_nodes_keep_gloo_on_lo_and_default_checkpoints(tmp_path: Path) -> None:
    job = _job(tmp_path, None)
    hosts = [_node(0, "a", "127.0.0.2"), _node(1, "b", "127.0.0.3")]
    env = job.environment(Allocation("t4", (0, 1)), hosts, 1)
    assert env["GLOO_SOCKET_IFNAME"] == "lo" and env["MASTER_ADDR"] == "127.0.0.2"
    assert env["SHOAL_CHECKPOINT_DIR"] == str(tmp_path / "checkpoints" / "j")


def test_a_service_on_every_interface_is_reached_at_the_driver(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from shoal.backends.ray import connect

    monkeypatch.setattr(connect, "driver_address", lambda: "10.0.0.9")
    assert RayBackend._reachable("http://0.0.0.0:8123") == "http://10.0.0.9:8123"
    assert RayBackend._reachable("http://127.0.0.1:8123") == "http://127.0.0.1:8123"


def test_what_probes_measured_survives_a_service_restart(tmp_path: Path) -> None:
    job = _job(tmp_path, None)
    row = {"device_type": "v100", "num_nodes": 1, "num_replicas": 1, "local_bsz": 16,
           "accum_steps": 0, "step_time": 0.1, "sync_time": 0.0, "count": 8}
    job.model.update({"probe": True, "profile": [row]})
    job.profiling_seconds = 12.5
    job.persist()
    again = _job(tmp_path, None)  # the next service's view of the same job
    again.adopt(0.0)
    assert again.model.probe_rows == [row] and again.profiling_seconds == 12.5
    assert set(again.model.rows_by_type()) == {"v100"}  # not probed on v100 a second time
