"""The machine's device pool: settings from arguments or the environment, checked."""

from __future__ import annotations

import pytest

from shoal.backends.local.devices import (
    MEMORY_VARIABLE,
    TFLOPS_VARIABLE,
    cpu_tflops,
    detect_pool,
)
from shoal.perf.parallel import gpu_peak_tflops
from shoal.spec.errors import SpecError


def test_cpu_slots_and_their_memory_come_from_arguments_or_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHOAL_CPU_SLOTS", "3")
    monkeypatch.setenv(MEMORY_VARIABLE, "1.5")
    pool = detect_pool("cpu")
    assert (pool.slots, pool.threads_per_slot, pool.device().memory_gb) == (3, 1, 1.5)
    pool = detect_pool("cpu", slots=2, cores_per_slot=2, memory_gb=4.0)
    assert (pool.slots, pool.threads_per_slot, pool.device().memory_gb) == (2, 2, 4.0)
    monkeypatch.delenv(MEMORY_VARIABLE)
    machine = detect_pool("cpu", slots=1).device().memory_gb
    assert detect_pool("cpu", slots=4).device().memory_gb == pytest.approx(machine / 4)


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("SHOAL_CPU_SLOTS", "two", "is not a whole number"),
    ("SHOAL_CPU_SLOTS", "0", "must be at least 1"),
    (MEMORY_VARIABLE, "lots", "is not a number"),
    (MEMORY_VARIABLE, "-1", "must be positive"),
    (TFLOPS_VARIABLE, "fast", "is not a number"),
])
def test_bad_settings_name_the_variable(monkeypatch: pytest.MonkeyPatch, variable: str,
                                        value: str, message: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SpecError, match=message) as error:
        detect_pool("cpu")
    assert error.value.field == variable


def test_a_bad_memory_argument_is_refused_like_the_variable() -> None:
    with pytest.raises(SpecError, match="must be positive") as error:
        detect_pool("cpu", memory_gb=0.0)
    assert error.value.field == MEMORY_VARIABLE


def test_cpu_slots_are_planned_at_their_measured_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TFLOPS_VARIABLE, raising=False)
    measured = cpu_tflops(1)
    # A float32 product on one core: well above zero, far below the GPU default of 65.
    assert 1e-4 < measured < 5.0
    assert detect_pool("cpu", slots=2).device().peak_tflops == measured
    monkeypatch.setenv(TFLOPS_VARIABLE, "0.5")
    assert detect_pool("cpu", slots=2).device().peak_tflops == 0.5


@pytest.mark.parametrize(("name", "peak"), [
    ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA H100 80GB HBM3", 989.0),
    ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H200", 989.0), ("Tesla V100-SXM2-32GB", 125.0),
    ("Tesla T4", 65.0), ("t4", 65.0), ("NVIDIA GeForce RTX 4090", None),
])
def test_known_gpus_are_planned_at_their_data_sheet_peak(name: str, peak: float | None) -> None:
    assert gpu_peak_tflops(name) == peak


def test_a_gpu_pool_takes_the_peak_of_its_model(monkeypatch: pytest.MonkeyPatch) -> None:
    import shoal.backends.local.devices as devices

    monkeypatch.delenv(TFLOPS_VARIABLE, raising=False)
    monkeypatch.setattr(devices, "_cuda_devices", lambda: 2)
    monkeypatch.setattr(devices, "_gpu_memory_gb", lambda: 80.0)
    monkeypatch.setattr(devices, "_gpu_name", lambda: "NVIDIA A100-SXM4-80GB")
    assert detect_pool("gpu").device().peak_tflops == 312.0
    monkeypatch.setattr(devices, "_gpu_name", lambda: "NVIDIA GeForce RTX 4090")
    assert detect_pool("gpu").device().peak_tflops == 65.0  # unknown model: the default
    monkeypatch.setenv(TFLOPS_VARIABLE, "165")
    assert detect_pool("gpu").device().peak_tflops == 165.0
