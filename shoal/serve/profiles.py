"""Latency and memory of serving a model on a device group with a pipeline/tensor split.

LLM model (roofline, per pipeline stage; ``s = pp * tp`` devices share the weights):

* prefill of a batch with prompt lengths p_i:
  ``max(F / (s * peak * MFU), W / (s * BW * BW_EFF))`` with ``F = 2 P sum(p_i) + 2 L H sum(p_i^2)``
  (weights' matmuls plus causal attention) and ``W = 2 P`` bytes of FP16 weights;
* each decode step (batch b, KV cache of c tokens in total):
  ``max(2 P b / (s * peak * MFU), (W + KV c) / (s * BW * BW_EFF)) + (L / pp) * LAYER_OVERHEAD``;
  a batch decodes ``max(output_i)`` steps (static batching);
* tensor parallelism adds two ring all-reduces per layer of ``tokens * H * 2`` bytes:
  ``2 (tp-1)/tp * bytes / link + ALPHA`` each; pipeline parallelism adds one activation send per
  stage boundary per step.

The stage time is the batch's total per-stage time; AlpaServe's model treats the stages as
balanced and a batch flows through them one after another. For autoregressive decoding this
assumes enough batches in flight to fill the pipeline at token granularity (the bubble with a
lone batch is not modelled).

Constants (assumptions, typical of FP16 inference kernels): ``MFU = 0.5``,
``BW_EFF = 0.8``, ``LAYER_OVERHEAD = 20 us``, ``ALPHA = 10 us`` (30 us across nodes),
KV reserve of ``KV_RESERVE_TOKENS = 8192`` tokens and 1 GiB runtime overhead per device, 90% of
device memory usable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from shoal.serve.hardware import Device, Hardware
from shoal.serve.sim.workload import Workload

GIB = 1024**3
MFU = 0.5
BW_EFF = 0.8
LAYER_OVERHEAD_S = 20e-6
ALPHA_INTRA_S = 10e-6
ALPHA_INTER_S = 30e-6
KV_RESERVE_TOKENS = 8192
RUNTIME_OVERHEAD_BYTES = 1 * GIB
USABLE_MEMORY = 0.9
COLD_START_INIT_S = 2.0

BatchLatency = Callable[[Sequence[int]], float]
"""Seconds each pipeline stage is busy with a batch, given the requests' indices."""


@dataclass(frozen=True)
class ModelArch:
    """A decoder-only transformer (OPT family sizes from Zhang et al., 2022)."""

    name: str
    params: float
    layers: int
    hidden: int

    @property
    def weight_bytes(self) -> float:
        return 2.0 * self.params

    @property
    def kv_bytes_per_token(self) -> float:
        return 4.0 * self.layers * self.hidden  # K and V, FP16, every layer


ZOO: dict[str, ModelArch] = {
    a.name: a
    for a in (
        ModelArch("opt-1.3b", 1.3e9, 24, 2048),
        ModelArch("opt-2.7b", 2.7e9, 32, 2560),
        ModelArch("opt-6.7b", 6.7e9, 32, 4096),
        ModelArch("opt-13b", 13e9, 40, 5120),
        ModelArch("opt-30b", 30e9, 48, 7168),
    )
}

DEFAULT_MIX = ("opt-6.7b",)


def model_mix(num_models: int, names: Sequence[str] = DEFAULT_MIX) -> list[ModelArch]:
    """``num_models`` models cycling through ``names`` (model i is ``names[i % len]``)."""
    return [ZOO[names[i % len(names)]] for i in range(num_models)]


@dataclass(frozen=True)
class GroupSpec:
    """Devices of one type that hold whole models split ``pp`` stages x ``tp`` ways."""

    devices: tuple[Device, ...]
    pp: int
    tp: int

    def __post_init__(self) -> None:
        if self.pp * self.tp != len(self.devices):
            raise ValueError(f"pp*tp = {self.pp * self.tp} but the group has "
                             f"{len(self.devices)} devices")
        if len({d.hardware.name for d in self.devices}) != 1:
            raise ValueError("a serving group holds devices of one type")

    @property
    def hardware(self) -> Hardware:
        return self.devices[0].hardware

    @property
    def size(self) -> int:
        return len(self.devices)

    @property
    def single_node(self) -> bool:
        return len({d.node_id for d in self.devices}) == 1

    @property
    def shape(self) -> tuple[str, int, int, bool]:
        """Groups with equal shape behave identically."""
        return (self.hardware.name, self.pp, self.tp, self.single_node)


class LatencyModel(Protocol):
    def batch_latency(self, model: int, group: GroupSpec, workload: Workload) -> BatchLatency: ...

    def memory_per_device(self, model: int, group: GroupSpec) -> float: ...

    def reference_latency(self, workload: Workload, hardware: Hardware) -> np.ndarray: ...

    def cold_start_s(self, model: int, group: GroupSpec) -> float: ...


@dataclass(frozen=True)
class LLMLatencyModel:
    """Roofline latency of the models ``archs`` (model id i is ``archs[i]``)."""

    archs: tuple[ModelArch, ...]

    def batch_latency(self, model: int, group: GroupSpec, workload: Workload) -> BatchLatency:
        arch = self.archs[model]
        hw = group.hardware
        shards = group.pp * group.tp
        flops_rate = hw.peak_tflops * 1e12 * MFU
        byte_rate = hw.memory_gbps * 1e9 * BW_EFF
        weights_s = arch.weight_bytes / shards / byte_rate
        token_flops_s = 2.0 * arch.params / shards / flops_rate
        attn_flops_s = 2.0 * arch.layers * arch.hidden / shards / flops_rate
        kv_s = arch.kv_bytes_per_token / shards / byte_rate
        layers_per_stage = arch.layers / group.pp
        step_overhead = layers_per_stage * LAYER_OVERHEAD_S
        alpha = ALPHA_INTRA_S if group.single_node else ALPHA_INTER_S
        link = (hw.intra_node_gbps if group.single_node else hw.inter_node_gbps) * 1e9
        act_bytes = arch.hidden * 2.0
        tp_factor = 2.0 * (group.tp - 1) / group.tp if group.tp > 1 else 0.0
        tp_calls = 2.0 * layers_per_stage if group.tp > 1 else 0.0
        pp_calls = 1.0 if group.pp > 1 else 0.0

        def comm(tokens: float) -> float:
            bytes_ = tokens * act_bytes
            return (tp_calls * (tp_factor * bytes_ / link + alpha)
                    + pp_calls * (bytes_ / link + alpha))

        prompt = workload.prompt_list
        output = workload.output_list

        def latency(requests: Sequence[int]) -> float:
            tokens = 0
            square = 0
            steps = 0
            for r in requests:
                p = prompt[r]
                tokens += p
                square += p * p
                if output[r] > steps:
                    steps = output[r]
            b = len(requests)
            prefill = max(tokens * token_flops_s + square * attn_flops_s, weights_s)
            prefill += step_overhead + comm(tokens)
            # Mean KV length over the decode steps: prompts plus half the generated tokens.
            kv_tokens = tokens + b * steps / 2.0
            step = max(b * token_flops_s, weights_s + kv_tokens * kv_s) + step_overhead + comm(b)
            return prefill + (steps - 1) * step

        return latency

    def memory_per_device(self, model: int, group: GroupSpec) -> float:
        arch = self.archs[model]
        shared = arch.weight_bytes + arch.kv_bytes_per_token * KV_RESERVE_TOKENS
        return shared / (group.pp * group.tp)

    def device_capacity(self, hardware: Hardware) -> float:
        return hardware.memory_gb * GIB * USABLE_MEMORY - RUNTIME_OVERHEAD_BYTES

    def reference_latency(self, workload: Workload, hardware: Hardware) -> np.ndarray:
        """Each request alone on one device of ``hardware`` (memory ignored): the SLO base."""
        device = Device(0, 0, hardware)
        out = np.empty(len(workload))
        fns = {m: self.batch_latency(m, GroupSpec((device,), 1, 1), workload)
               for m in range(len(self.archs))}
        for i, m in enumerate(workload.model.tolist()):
            out[i] = fns[m]((i,))
        return out

    def cold_start_s(self, model: int, group: GroupSpec) -> float:
        shard = self.archs[model].weight_bytes / (group.pp * group.tp)
        return COLD_START_INIT_S + shard / (group.hardware.host_gbps * 1e9)


@dataclass(frozen=True)
class WorkLatencyModel:
    """Service time = the requests' own ``work_s`` summed over the batch, split over stages
    (plus ``per_batch_s``). Used for closed-form queueing checks."""

    per_batch_s: float = 0.0
    memory_bytes: float = 0.0
    cold_start: float = 0.0

    def batch_latency(self, model: int, group: GroupSpec, workload: Workload) -> BatchLatency:
        if workload.work_s is None:
            raise ValueError("WorkLatencyModel needs a workload with work_s")
        work = workload.work_s.tolist()
        stages = group.pp
        speed = group.hardware.peak_tflops / 100.0 * group.tp  # 100 TFLOP/s = speed 1

        def latency(requests: Sequence[int]) -> float:
            return (self.per_batch_s + sum(work[r] for r in requests)) / (stages * speed)

        return latency

    def memory_per_device(self, model: int, group: GroupSpec) -> float:
        return self.memory_bytes / group.size

    def device_capacity(self, hardware: Hardware) -> float:
        return hardware.memory_gb * GIB

    def reference_latency(self, workload: Workload, hardware: Hardware) -> np.ndarray:
        assert workload.work_s is not None
        return (self.per_batch_s + workload.work_s) / (hardware.peak_tflops / 100.0)

    def cold_start_s(self, model: int, group: GroupSpec) -> float:
        return self.cold_start


@dataclass(frozen=True)
class BatchTableLatencyModel:
    """Measured latency per batch size (e.g. profiled from a real server), one table for all
    models; batch sizes beyond the table are extrapolated linearly from its last two points."""

    batch_sizes: tuple[int, ...]
    latency_s: tuple[float, ...]

    def _at(self, b: int) -> float:
        return float(np.interp(b, self.batch_sizes, self.latency_s)) if b <= self.batch_sizes[-1] \
            else self.latency_s[-1] + (b - self.batch_sizes[-1]) * (
                (self.latency_s[-1] - self.latency_s[-2]) /
                max(1, self.batch_sizes[-1] - self.batch_sizes[-2]))

    def batch_latency(self, model: int, group: GroupSpec, workload: Workload) -> BatchLatency:
        return lambda requests: self._at(len(requests)) / group.pp

    def memory_per_device(self, model: int, group: GroupSpec) -> float:
        return 0.0

    def device_capacity(self, hardware: Hardware) -> float:
        return hardware.memory_gb * GIB

    def reference_latency(self, workload: Workload, hardware: Hardware) -> np.ndarray:
        return np.full(len(workload), self._at(1))

    def cold_start_s(self, model: int, group: GroupSpec) -> float:
        return 0.0
