"""Device types, nodes and clusters."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shoal.spec.errors import SpecError, from_validation_error
from shoal.spec.suggest import did_you_mean


class DeviceType(BaseModel):
    """One kind of accelerator (or CPU slot)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    memory_gb: float = Field(gt=0, description="device memory in GiB")
    relative_speed: float = Field(default=1.0, gt=0, description="compute speed relative to T4")
    peak_tflops: float = Field(default=65.0, gt=0, description="dense fp16 peak TFLOP/s")
    intra_node_gbps: float = Field(default=32.0, gt=0, description="GB/s between devices of a node")
    inter_node_gbps: float = Field(default=12.5, gt=0, description="GB/s between nodes")
    price_per_hour: float = Field(default=0.0, ge=0, description="cost of one device-hour")


class NodeGroup(BaseModel):
    """``count`` identical nodes, each with ``devices_per_node`` devices of one type."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device_type: str
    devices_per_node: int = Field(ge=1, le=64)
    count: int = Field(ge=1)


class ClusterSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "cluster"
    device_types: list[DeviceType] = Field(min_length=1)
    nodes: list[NodeGroup] = Field(min_length=1)

    @model_validator(mode="after")
    def _check_types(self) -> ClusterSpec:
        known = [d.name for d in self.device_types]
        if len(set(known)) != len(known):
            raise ValueError(f"device type names must be unique, got {known}")
        for group in self.nodes:
            if group.device_type not in known:
                raise ValueError(
                    f"node group uses device type '{group.device_type}', which is not among "
                    f"device_types {known}; add it there or fix the name"
                )
        return self

    def device_type(self, name: str) -> DeviceType:
        for dtype in self.device_types:
            if dtype.name == name:
                return dtype
        raise KeyError(name)

    def expand(self) -> list[NodeInfo]:
        """Concrete nodes, numbered 0..N-1 in the order of the node groups."""
        out: list[NodeInfo] = []
        for group in self.nodes:
            for _ in range(group.count):
                out.append(NodeInfo(len(out), group.device_type, group.devices_per_node))
        return out

    @property
    def total_devices(self) -> int:
        return sum(g.count * g.devices_per_node for g in self.nodes)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    node_id: int
    device_type: str
    capacity: int


_PRESET_DIR = Path(__file__).parent / "presets"


def preset_names() -> list[str]:
    return sorted(p.stem for p in _PRESET_DIR.glob("*.yaml"))


def parse_cluster(data: dict, source: str | None = None) -> ClusterSpec:
    try:
        return ClusterSpec.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc, source, ClusterSpec) from exc


def load_cluster(preset_or_path: str) -> ClusterSpec:
    """A cluster from a preset name (see :func:`preset_names`) or a YAML file."""
    path = Path(preset_or_path)
    if not path.exists():
        path = _PRESET_DIR / f"{preset_or_path}.yaml"
        if not path.exists():
            raise SpecError(
                f"'{preset_or_path}' is neither a cluster YAML file nor a preset"
                f"{did_you_mean(preset_or_path, preset_names())}; "
                f"presets: {', '.join(preset_names())}",
                field="cluster",
            )
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(f"not valid YAML: {exc}", source=str(path)) from exc
    if not isinstance(data, dict):
        raise SpecError("a cluster file must be a mapping", source=str(path))
    return parse_cluster(data, source=str(path))
