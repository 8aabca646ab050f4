"""Settings of one service instance; SHOAL_HOME keeps instances apart."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


def shoal_home(value: str | Path | None = None) -> Path:
    """``value``, else ``$SHOAL_HOME``, else ``~/.shoal``."""
    raw = value or os.environ.get("SHOAL_HOME") or Path.home() / ".shoal"
    return Path(raw).expanduser().resolve()


@dataclass(frozen=True)
class ServiceConfig:
    home: Path
    port: int
    host: str = "127.0.0.1"
    db_url: str | None = None  # default: SQLite at HOME/shoal.db
    policy: str = "pollux"
    interval_s: float = 10.0
    device: str | None = None  # auto, cpu, gpu (SHOAL_DEVICE)
    slots: int | None = None  # SHOAL_CPU_SLOTS
    cores_per_slot: int | None = None  # SHOAL_CORES_PER_SLOT
    slot_memory_gb: float | None = None  # SHOAL_SLOT_MEMORY_GB
    max_retries: int = 3
    backoff_s: float = 2.0
    checkpoint_interval_s: float = 30.0
    restart_delay_s: float = 10.0  # what the policy charges for one restart
    knobs: tuple[str, ...] = ()  # KEY=VALUE changes to the shoal policy's knobs
    backend: str = "local"  # local or ray
    ray_address: str | None = None  # ray: the cluster to join (default: start a local one)
    checkpoint_dir: Path | None = None  # ray: checkpoints, on a path every node can read

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def database(self) -> str:
        return self.db_url or f"sqlite:///{self.home / 'shoal.db'}"


def info_path(home: Path) -> Path:
    return home / "service.json"


def write_info(config: ServiceConfig, pid: int) -> None:
    info_path(config.home).write_text(
        json.dumps({"url": config.url, "pid": pid, "policy": config.policy})
    )


def read_info(home: Path) -> dict[str, object] | None:
    try:
        return dict(json.loads(info_path(home).read_text()))
    except (FileNotFoundError, ValueError):
        return None


def port_path(home: Path) -> Path:
    """The last port this home's service used: kept so that re-adopted jobs can report again."""
    return home / "service.port"
