"""The machine's devices as a pool: GPUs when CUDA works, otherwise CPU slots of N cores.

Settings (environment, or arguments of :func:`detect_pool`):

- ``SHOAL_DEVICE``: ``auto`` (default), ``cpu`` or ``gpu``.
- ``SHOAL_CPU_SLOTS``: number of CPU slots (default: cores // cores per slot, at least 1).
- ``SHOAL_CORES_PER_SLOT``: threads given to each replica on a CPU slot (default 1). More
  slots than cores oversubscribes the CPU, which is fine for demos on small machines.
- ``SHOAL_SLOT_MEMORY_GB``: memory of one device in GiB, the bound a job that declares its model
  is planned under (default: a GPU's own memory; for CPU slots the machine's memory over the
  slots).
- ``SHOAL_SLOT_TFLOPS``: peak TFLOP/s of one device, from which a plan's step time is predicted
  (default: for CPU slots, measured once with a float32 matrix product on the slot's threads;
  for GPUs, the data-sheet peak of a known model, else the device type's default).
"""

from __future__ import annotations

import functools
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from shoal.perf.parallel import gpu_peak_tflops
from shoal.spec.cluster import DeviceType
from shoal.spec.errors import SpecError

MEMORY_VARIABLE = "SHOAL_SLOT_MEMORY_GB"
TFLOPS_VARIABLE = "SHOAL_SLOT_TFLOPS"
DEFAULT_PEAK_TFLOPS: float = DeviceType.model_fields["peak_tflops"].default


@dataclass(frozen=True, slots=True)
class DevicePool:
    """One node's devices: ``slots`` devices of ``device_type``, ``threads`` per replica."""

    device_type: str
    slots: int
    threads_per_slot: int
    gpu_ids: tuple[int, ...] = ()
    memory_gb: float | None = None  # per device; None: the machine's memory over the slots
    peak_tflops: float | None = None  # per device; None: measured (CPU) or the type's default

    def device(self) -> DeviceType:
        """The devices as the parallel planner sees them: their memory bounds a plan, their
        peak rate predicts its step time."""
        memory = self.memory_gb or _machine_memory_gb() / self.slots
        peak = self.peak_tflops or (None if self.gpu_ids else cpu_tflops(self.threads_per_slot))
        return DeviceType(name=self.device_type, memory_gb=memory,
                          peak_tflops=peak or DEFAULT_PEAK_TFLOPS)

    def describe(self) -> str:
        if self.gpu_ids:
            return f"{self.slots} GPU(s) {list(self.gpu_ids)}"
        return f"{self.slots} CPU slot(s) of {self.threads_per_slot} thread(s)"


def _setting(value: float | None, env: str, parse: type[int] | type[float]) -> float | None:
    """A positive setting: ``value`` if given, else the environment variable ``env``, else None.
    Whole numbers (``parse=int``) must be at least 1."""
    raw: str | float | None = value if value is not None else os.environ.get(env, "").strip()
    if raw is None or raw == "":
        return None
    try:
        number = parse(raw)
    except ValueError:
        kind = "a whole number" if parse is int else "a number"
        raise SpecError(f"{env}={raw!r} is not {kind}", field=env) from None
    if number <= 0:
        raise SpecError(f"{env}={number:g} must be {'at least 1' if parse is int else 'positive'}",
                        field=env)
    return number


def configured_memory_gb(value: float | None = None) -> float | None:
    """The device memory set explicitly (``value``, else ``SHOAL_SLOT_MEMORY_GB``), or None."""
    return _setting(value, MEMORY_VARIABLE, float)


@functools.cache
def cpu_tflops(threads: int, size: int = 512, repeats: int = 5) -> float:
    """Float32 matrix-product TFLOP/s of ``threads`` CPU threads: the best of ``repeats``
    timings (about 0.04 s once torch is imported), measured once per process."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(size, size), torch.randn(size, size)
        torch.mm(a, b)  # the first product allocates and warms the kernels
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(previous)
    return 2 * size**3 / max(best, 1e-9) / 1e12


def _setting_int(value: int | None, env: str, default: int) -> int:
    number = _setting(value, env, int)
    return default if number is None else int(number)


def _machine_memory_gb() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def _gpu_memory_gb() -> float:
    import torch

    return torch.cuda.get_device_properties(0).total_memory / 2**30


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0)


def _cuda_devices() -> int:
    """GPU count, importing torch only when a GPU driver is visible at all."""
    if shutil.which("nvidia-smi") is None and not Path("/dev/nvidia0").exists():
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def detect_pool(
    device: str | None = None, slots: int | None = None, cores_per_slot: int | None = None,
    memory_gb: float | None = None,
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
                          tuple(range(count)),
                          _setting(memory_gb, MEMORY_VARIABLE, float) or _gpu_memory_gb(),
                          _setting(None, TFLOPS_VARIABLE, float) or gpu_peak_tflops(_gpu_name()))
    per_slot = _setting_int(cores_per_slot, "SHOAL_CORES_PER_SLOT", 1)
    default_slots = max(1, (os.cpu_count() or 1) // per_slot)
    return DevicePool("cpu", _setting_int(slots, "SHOAL_CPU_SLOTS", default_slots), per_slot,
                      memory_gb=_setting(memory_gb, MEMORY_VARIABLE, float),
                      peak_tflops=_setting(None, TFLOPS_VARIABLE, float))
