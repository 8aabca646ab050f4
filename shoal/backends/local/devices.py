"""The machine's devices as a pool: GPUs when CUDA works, otherwise CPU slots of N cores.

Settings (environment, or arguments of :func:`detect_pool`):

- ``SHOAL_DEVICE``: ``auto`` (default), ``cpu`` or ``gpu``.
- ``SHOAL_CPU_SLOTS``: number of CPU slots (default: cores // cores per slot, at least 1).
- ``SHOAL_CORES_PER_SLOT``: threads given to each replica on a CPU slot (default 1). More
  slots than cores oversubscribes the CPU, which is fine for demos on small machines.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from shoal.spec.errors import SpecError


@dataclass(frozen=True, slots=True)
class DevicePool:
    """One node's devices: ``slots`` devices of ``device_type``, ``threads`` per replica."""

    device_type: str
    slots: int
    threads_per_slot: int
    gpu_ids: tuple[int, ...] = ()

    def describe(self) -> str:
        if self.gpu_ids:
            return f"{self.slots} GPU(s) {list(self.gpu_ids)}"
        return f"{self.slots} CPU slot(s) of {self.threads_per_slot} thread(s)"


def _setting_int(value: int | None, env: str, default: int) -> int:
    if value is not None:
        raw: str | int = value
    else:
        raw = os.environ.get(env, "").strip() or default
    try:
        number = int(raw)
    except ValueError:
        raise SpecError(f"{env}={raw!r} is not a whole number", field=env) from None
    if number < 1:
        raise SpecError(f"{env}={number} must be at least 1", field=env)
    return number


def _cuda_devices() -> int:
    """GPU count, importing torch only when a GPU driver is visible at all."""
    if shutil.which("nvidia-smi") is None and not Path("/dev/nvidia0").exists():
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def detect_pool(
    device: str | None = None, slots: int | None = None, cores_per_slot: int | None = None
) -> DevicePool:
    device = (device or os.environ.get("SHOAL_DEVICE") or "auto").lower()
    if device not in ("auto", "cpu", "gpu"):
        raise SpecError(f"SHOAL_DEVICE={device!r}: use auto, cpu or gpu", field="SHOAL_DEVICE")
    gpus = _cuda_devices() if device in ("auto", "gpu") else 0
    if device == "gpu" and gpus == 0:
        raise SpecError("SHOAL_DEVICE=gpu but torch sees no CUDA device", field="SHOAL_DEVICE")
    if gpus:
        count = min(gpus, slots) if slots else gpus
        return DevicePool("gpu", count, _setting_int(cores_per_slot, "SHOAL_CORES_PER_SLOT", 1),
                          tuple(range(count)))
    per_slot = _setting_int(cores_per_slot, "SHOAL_CORES_PER_SLOT", 1)
    default_slots = max(1, (os.cpu_count() or 1) // per_slot)
    return DevicePool("cpu", _setting_int(slots, "SHOAL_CPU_SLOTS", default_slots), per_slot)
