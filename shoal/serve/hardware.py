"""Devices for serving: hardware numbers per device type and the ``--devices`` spec.

Peak dense FP16 tensor throughput, memory and memory bandwidth are the vendors' datasheet
figures (NVIDIA T4, V100 SXM2 32 GB, A100 SXM4 80 GB, H100 SXM5 80 GB datasheets); link speeds
are NVLink / PCIe generation figures per direction. They feed the roofline latency model in
:mod:`shoal.serve.profiles`.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from shoal.spec.cluster import ClusterSpec, DeviceType, load_cluster
from shoal.spec.errors import SpecError


@dataclass(frozen=True)
class Hardware:
    """What the latency model needs to know about one device type."""

    name: str
    peak_tflops: float  # dense FP16 tensor TFLOP/s
    memory_gb: float
    memory_gbps: float  # device memory bandwidth, GB/s
    intra_node_gbps: float  # per-direction link bandwidth between devices of a node
    inter_node_gbps: float  # network bandwidth between nodes
    host_gbps: float  # host-to-device copy bandwidth (cold starts)


BUILTIN: dict[str, Hardware] = {
    # T4: 65 TFLOPS FP16, 16 GB GDDR6 at 320 GB/s, PCIe 3 x16 (~12 GB/s achievable).
    "t4": Hardware("t4", 65.0, 16.0, 320.0, 12.0, 12.5, 12.0),
    # V100 SXM2: 125 TFLOPS, 32 GB HBM2 at 900 GB/s, NVLink2 150 GB/s per direction.
    "v100": Hardware("v100", 125.0, 32.0, 900.0, 150.0, 12.5, 12.0),
    # A100 SXM4 80 GB: 312 TFLOPS, 2039 GB/s, NVLink3 300 GB/s per direction, PCIe 4.
    "a100": Hardware("a100", 312.0, 80.0, 2039.0, 300.0, 25.0, 25.0),
    # H100 SXM5: 989 TFLOPS dense FP16, 3350 GB/s, NVLink4 450 GB/s per direction, PCIe 5.
    "h100": Hardware("h100", 989.0, 80.0, 3350.0, 450.0, 50.0, 50.0),
}


def hardware_for(device: DeviceType) -> Hardware:
    """Hardware of a cluster's device type: its spec's numbers plus a known memory bandwidth."""
    known = BUILTIN.get(device.name)
    if known is None:
        raise SpecError(
            f"no memory-bandwidth figure for device type '{device.name}'; serving knows "
            f"{sorted(BUILTIN)} (add it to shoal.serve.hardware.BUILTIN)",
            field="device_types",
        )
    return Hardware(device.name, device.peak_tflops, device.memory_gb, known.memory_gbps,
                    device.intra_node_gbps, device.inter_node_gbps, known.host_gbps)


@dataclass(frozen=True)
class Device:
    device_id: int
    node_id: int
    hardware: Hardware


@dataclass(frozen=True)
class ServingCluster:
    devices: tuple[Device, ...]

    def __len__(self) -> int:
        return len(self.devices)

    def by_type(self) -> dict[str, list[Device]]:
        out: dict[str, list[Device]] = {}
        for device in self.devices:
            out.setdefault(device.hardware.name, []).append(device)
        return out

    def most_common_type(self) -> Hardware:
        name = Counter(d.hardware.name for d in self.devices).most_common(1)[0][0]
        return next(d.hardware for d in self.devices if d.hardware.name == name)


_ENTRY = re.compile(r"^([a-z0-9][a-z0-9_.-]*):(\d+)(?:@(\d+))?$")


def parse_devices(spec: str) -> ServingCluster:
    """``TYPE:COUNT[@PER_NODE][,...]`` (e.g. ``v100:32`` or ``t4:16@4,a100:8``), or a cluster
    preset name / YAML path as accepted by ``shoal.spec.cluster.load_cluster``."""
    spec = spec.strip()
    if ":" not in spec:
        return from_cluster_spec(load_cluster(spec))
    devices: list[Device] = []
    node = 0
    for entry in spec.split(","):
        match = _ENTRY.match(entry.strip().lower())
        if not match:
            raise SpecError(f"'{entry}' is not TYPE:COUNT[@PER_NODE], e.g. v100:32 or t4:16@4",
                            field="devices")
        name, count, per_node = match.group(1), int(match.group(2)), int(match.group(3) or 8)
        if name not in BUILTIN:
            raise SpecError(f"unknown device type '{name}'; known: {sorted(BUILTIN)}",
                            field="devices")
        if count < 1 or per_node < 1:
            raise SpecError(f"'{entry}': COUNT and PER_NODE must be >= 1", field="devices")
        for i in range(count):
            devices.append(Device(len(devices), node + i // per_node, BUILTIN[name]))
        node += -(-count // per_node)
    return ServingCluster(tuple(devices))


def from_cluster_spec(cluster: ClusterSpec) -> ServingCluster:
    devices: list[Device] = []
    for node in cluster.expand():
        hw = hardware_for(cluster.device_type(node.device_type))
        for _ in range(node.capacity):
            devices.append(Device(len(devices), node.node_id, hw))
    return ServingCluster(tuple(devices))
