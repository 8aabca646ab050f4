"""Attach this process to a Ray cluster, or start a one-node cluster offering this machine.

Settings from the environment (besides Ray's own, e.g. ``RAY_AUTH_MODE``):

- ``SHOAL_RAY_NODE_IP``: the IP address this process (the Ray driver) uses. Default: the host of
  a loopback ``--address`` (127.x, where the cluster runs on this machine), else Ray's choice.
- ``SHOAL_RAY_OBJECT_STORE_MB``: object store of a cluster started here (default 128; shoal
  moves only small messages through it).
- ``SHOAL_RAY_TEMP_DIR``: Ray's session folder for a cluster started here (default Ray's,
  /tmp/ray); keep the path short, Ray puts Unix sockets under it.
"""

from __future__ import annotations

import logging
import os

import ray

from shoal.backends.local.devices import DevicePool
from shoal.backends.ray.nodes import RESOURCE_PREFIX, TYPE_LABEL

log = logging.getLogger(__name__)

NAMESPACE = "shoal"


def _driver_ip(address: str | None) -> str | None:
    explicit = os.environ.get("SHOAL_RAY_NODE_IP", "").strip()
    if explicit:
        return explicit
    host = (address or "").removeprefix("ray://").rsplit(":", 1)[0]
    return host if host.startswith("127.") else None


def connect(address: str | None, pool: DevicePool) -> bool:
    """Join the cluster at ``address`` (``auto``: the one on this machine); without an address
    start a local one whose devices are ``pool``. True when this call started a cluster."""
    if ray.is_initialized():
        return False
    common: dict[str, object] = {
        "namespace": NAMESPACE,
        "log_to_driver": False,
        "logging_level": logging.WARNING,
    }
    node_ip = _driver_ip(address)
    if node_ip:
        common["_node_ip_address"] = node_ip
    if address:
        ray.init(address=address, **common)  # type: ignore[arg-type]
        return False
    if pool.gpu_ids:
        offer: dict[str, object] = {"num_gpus": pool.slots, "labels": {TYPE_LABEL: "gpu"}}
    else:
        offer = {"resources": {f"{RESOURCE_PREFIX}{pool.device_type}": float(pool.slots)}}
    store_mb = int(os.environ.get("SHOAL_RAY_OBJECT_STORE_MB", "128"))
    temp_dir = os.environ.get("SHOAL_RAY_TEMP_DIR", "").strip()
    if temp_dir:
        common["_temp_dir"] = temp_dir
    ray.init(include_dashboard=False, object_store_memory=store_mb << 20, **offer,
             **common)  # type: ignore[arg-type]
    log.info("started a one-node Ray cluster offering %s", pool.describe())
    return True


def disconnect() -> None:
    """Leave the cluster (a cluster this process started stops with it)."""
    if ray.is_initialized():
        ray.shutdown()


def driver_address() -> str:
    return str(ray.util.get_node_ip_address())


def cluster_address() -> str:
    """The GCS address of the connected cluster (what ``--address`` takes)."""
    return str(ray.get_runtime_context().gcs_address)
