"""The environment contract between a backend and a training process.

torchrun conventions (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) plus shoal's own
``SHOAL_*`` variables. Every variable is optional: a plain ``python train.py`` is rank 0 of 1.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


class TrainEnvError(ValueError):
    """An environment variable holds a value the library cannot use."""


def _int(env: Mapping[str, str], name: str, default: int | None, minimum: int) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise TrainEnvError(f"{name}={raw!r} is not an integer; set a whole number") from None
    if value < minimum:
        raise TrainEnvError(f"{name}={value} must be at least {minimum}")
    return value


def _float(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise TrainEnvError(f"{name}={raw!r} is not a number; set {name} to seconds") from None
    if value <= 0:
        raise TrainEnvError(f"{name}={value} must be positive")
    return value


@dataclass(frozen=True, slots=True)
class TrainEnv:
    """What a training process learns about its place in the job from the environment."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    num_nodes: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    job: str = "local"
    checkpoint_dir: Path | None = None
    scheduler_url: str | None = None
    batch_size: int | None = None
    max_batch_size: int | None = None
    max_local_bsz: int | None = None
    checkpoint_interval_s: float | None = None
    standby_file: Path | None = None
    device_type: str | None = None
    # A probe: train this many steps from scratch on one device, report the step times (marked
    # "probe") and exit 0; the backend measures a device type the job has not run on this way.
    probe_steps: int | None = None

    @classmethod
    def from_environ(cls, env: Mapping[str, str] | None = None) -> TrainEnv:
        env = os.environ if env is None else env
        world_size = _int(env, "WORLD_SIZE", 1, 1)
        rank = _int(env, "RANK", 0, 0)
        assert world_size is not None and rank is not None
        if rank >= world_size:
            raise TrainEnvError(f"RANK={rank} must be below WORLD_SIZE={world_size}")
        local_world_size = _int(env, "LOCAL_WORLD_SIZE", world_size, 1)
        assert local_world_size is not None
        nodes_default = max(1, -(-world_size // local_world_size))
        checkpoint_dir = env.get("SHOAL_CHECKPOINT_DIR") or None
        url = (env.get("SHOAL_SCHEDULER_URL") or "").rstrip("/") or None
        probe_steps = _int(env, "SHOAL_PROBE_STEPS", None, 1)
        if probe_steps is not None and world_size > 1:
            raise TrainEnvError(f"SHOAL_PROBE_STEPS runs one process, not WORLD_SIZE={world_size}"
                                "; unset one of them")
        return cls(
            rank=rank,
            world_size=world_size,
            local_rank=_int(env, "LOCAL_RANK", 0, 0) or 0,
            local_world_size=local_world_size,
            num_nodes=_int(env, "SHOAL_NUM_NODES", nodes_default, 1) or nodes_default,
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=_int(env, "MASTER_PORT", 29500, 1) or 29500,
            job=env.get("SHOAL_JOB") or "local",
            checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir else None,
            scheduler_url=url,
            batch_size=_int(env, "SHOAL_BATCH_SIZE", None, 1),
            max_batch_size=_int(env, "SHOAL_MAX_BATCH_SIZE", None, 1),
            max_local_bsz=_int(env, "SHOAL_MAX_LOCAL_BSZ", None, 1),
            checkpoint_interval_s=_float(env, "SHOAL_CHECKPOINT_INTERVAL"),
            standby_file=Path(env["SHOAL_STANDBY_FILE"]) if env.get("SHOAL_STANDBY_FILE") else None,
            device_type=(env.get("SHOAL_DEVICE_TYPE") or "").strip() or None,
            probe_steps=probe_steps,
        )

    @property
    def distributed(self) -> bool:
        return self.world_size > 1
