"""Parallel plan search: the fastest layout of a GPT on ``K`` devices of one type that fits memory.

The search enumerates data / tensor / pipeline degrees (tensor parallel stays inside a node),
interleaved (virtual) pipeline stages, micro-batch size and with it the number of micro-batches
(gradient accumulation), recomputation (none, selective, full for a fraction of the layers), ZeRO
stage and optimizer offload. Each candidate's peak memory comes from ``shoal.perf.memory``; its
step time from a cost model:

* compute: training FLOPs of the slowest pipeline stage / (peak FLOP/s x efficiency), where the
  efficiency falls for small micro-batches and thin tensor-parallel shards;
* tensor parallel: 4 all-reduces of ``bsh`` per layer and micro-batch (6 when recomputed), ring
  alpha-beta over the intra-node link;
* pipeline: ``(M + (p-1)/v)`` micro-batch slots (the 1F1B bubble, shrunk by ``v`` interleaved
  stages) plus point-to-point sends over the inter-node link once stages span nodes;
* data parallel: one gradient all-reduce per step (ZeRO 0/1), a reduce-scatter per micro-batch
  (ZeRO-2), parameter all-gathers in forward and backward of every micro-batch (ZeRO-3), none of
  it overlapped with compute (a conservative choice);
* offload: gradients and parameters over the host link plus a CPU Adam step.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shoal.perf.memory import (
    MIXED_ADAM,
    MIXED_ADAM_FP32_GRADS,
    MemoryEstimate,
    ParallelConfig,
    Precision,
    RecomputePolicy,
    model_state_bytes,
    plan_memory,
)
from shoal.perf.models import GPTConfig
from shoal.spec.cluster import DeviceType
from shoal.spec.errors import SpecError

if TYPE_CHECKING:  # measuring needs torch; planning a GPT does not
    from shoal.perf.measure import MeasuredStep

GIB = 2**30

# Dense fp16/bf16 tensor-core peaks and per-device link bandwidths (one direction) from the
# vendors' data sheets: NVLink 3 (A100) 300 GB/s, NVLink 2 (V100) 150 GB/s, NVLink 4 (H100)
# 450 GB/s, PCIe 3 x16 (T4) 16 GB/s; inter-node one 200 Gb/s HDR link per A100 (25 GB/s), 400 Gb/s
# NDR per H100 (50 GB/s), 100 Gb/s per V100 (12.5 GB/s), 50 Gb/s per T4 (6.25 GB/s).
KNOWN_DEVICES: dict[str, DeviceType] = {
    d.name: d
    for d in (
        DeviceType(name="a100-80g", memory_gb=80, relative_speed=4.8, peak_tflops=312,
                   intra_node_gbps=300, inter_node_gbps=25),
        DeviceType(name="a100-40g", memory_gb=40, relative_speed=4.8, peak_tflops=312,
                   intra_node_gbps=300, inter_node_gbps=25),
        DeviceType(name="h100-80g", memory_gb=80, relative_speed=15.2, peak_tflops=989,
                   intra_node_gbps=450, inter_node_gbps=50),
        DeviceType(name="v100-32g", memory_gb=32, relative_speed=1.9, peak_tflops=125,
                   intra_node_gbps=150, inter_node_gbps=12.5),
        DeviceType(name="v100-16g", memory_gb=16, relative_speed=1.9, peak_tflops=125,
                   intra_node_gbps=150, inter_node_gbps=12.5),
        DeviceType(name="t4-16g", memory_gb=16, relative_speed=1.0, peak_tflops=65,
                   intra_node_gbps=16, inter_node_gbps=6.25),
    )
}


# Dense fp16 tensor peaks of GPU models by the name CUDA reports, from the same data sheets:
# each KNOWN_DEVICES family, plus the H200 (Hopper, as H100 SXM) and the slower PCIe cards.
_PEAK_BY_FAMILY = {name.split("-")[0]: d.peak_tflops for name, d in KNOWN_DEVICES.items()}
_PEAK_BY_FAMILY["h200"] = _PEAK_BY_FAMILY["h100"]
_PCIE_PEAK = {"h100": 756.0, "v100": 112.0}


def gpu_peak_tflops(name: str) -> float | None:
    """Data-sheet dense fp16 peak of a GPU from its name (``NVIDIA A100-SXM4-80GB``, ``Tesla
    T4``, a Ray accelerator type such as ``a100``); None for a model not in the table."""
    lowered = name.lower()
    for family, peak in _PEAK_BY_FAMILY.items():
        if re.search(rf"\b{family}\b", lowered):
            return _PCIE_PEAK.get(family, peak) if "pcie" in lowered else peak
    return None


def known_device(name: str) -> DeviceType:
    try:
        return KNOWN_DEVICES[name.lower()]
    except KeyError:
        raise SpecError(
            f"unknown device type {name!r}; known: {', '.join(sorted(KNOWN_DEVICES))}",
            field="devices",
        ) from None


@dataclass(frozen=True, slots=True)
class SearchSpace:
    """Which techniques the search may use."""

    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    offload: tuple[bool, ...] = (False, True)
    recompute: tuple[RecomputePolicy, ...] = ("none", "selective", "full")
    full_recompute_fractions: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
    max_micro_batch: int = 64
    max_virtual_stages: int = 4
    sequence_parallel: bool = True  # used whenever tp > 1 (same traffic, less memory)
    tensor_parallel: bool = True  # tp > 1 allowed
    pipeline_parallel: bool = True  # pp > 1 allowed
    flash_attention: bool = False
    precision: Precision = MIXED_ADAM
    reserved_bytes: float = 1 * GIB  # framework, allocator and communication buffers


# What Narayanan et al. 2021 could use: no ZeRO, no offload, no sequence parallelism, fp32
# gradient accumulation (18 bytes per parameter), full or no recomputation.
MEGATRON_2021 = SearchSpace(zero_stages=(0,), offload=(False,), recompute=("none", "full"),
                            full_recompute_fractions=(1.0,), sequence_parallel=False,
                            precision=MIXED_ADAM_FP32_GRADS)


@dataclass(frozen=True, slots=True)
class CostModel:
    max_efficiency: float = 0.7  # best fraction of peak FLOP/s a large GEMM-bound step reaches
    tokens_half: float = 256.0  # tokens per micro-batch at which efficiency halves
    width_half: float = 128.0  # hidden size per tensor-parallel rank at which it halves
    alpha_intra_s: float = 5e-6
    alpha_inter_s: float = 20e-6
    host_gbps: float = 25.0  # device <-> host link for offload
    cpu_adam_params_per_s: float = 1e9  # per device's share of host cores


@dataclass(frozen=True, slots=True)
class Plan:
    """A plan that fits, with its predicted per-device memory and step time."""

    config: ParallelConfig
    memory: MemoryEstimate
    step_time_s: float
    global_batch: int
    time_breakdown: dict[str, float] = field(default_factory=dict)

    @property
    def memory_bytes(self) -> float:
        return self.memory.peak

    @property
    def throughput(self) -> float:
        """Samples per second."""
        return self.global_batch / self.step_time_s

    @property
    def model_parallel_size(self) -> int:
        return self.config.tp * self.config.pp

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        return {
            "dp": c.dp, "tp": c.tp, "pp": c.pp, "virtual_stages": c.virtual_stages,
            "micro_batch": c.micro_batch, "accumulation": c.num_microbatches,
            "recompute": c.recompute,
            "recompute_fraction": c.recompute_fraction if c.recompute != "none" else 0.0,
            "zero_stage": c.zero_stage, "offload": c.offload,
            "sequence_parallel": c.sequence_parallel,
            "memory_bytes": int(self.memory_bytes), "step_time_s": self.step_time_s,
            "throughput_samples_per_s": self.throughput,
            "memory_breakdown": {
                "params": self.memory.params, "grads": self.memory.grads,
                "optimizer": self.memory.optimizer, "activations": self.memory.activations,
                "fsdp_buffers": self.memory.fsdp_buffers,
                "backward_transient": self.memory.backward_transient,
                "optimizer_transient": self.memory.optimizer_transient,
                "host_bytes": self.memory.host_bytes,
            },
            "time_breakdown": dict(self.time_breakdown),
        }


@dataclass(frozen=True, slots=True)
class Rejection:
    """A layout the search turned down and why; ``config`` is None for whole families."""

    reason: str
    config: ParallelConfig | None = None
    family: str = ""

    def describe(self) -> str:
        return f"{describe(self.config) if self.config else self.family}: {self.reason}"


@dataclass(slots=True)
class PlanSearchResult:
    plans: list[Plan]  # fitting plans, fastest first
    rejected: list[Rejection]
    considered: int
    seconds: float

    @property
    def best(self) -> Plan | None:
        return self.plans[0] if self.plans else None


def describe(c: ParallelConfig) -> str:
    recompute = c.recompute
    if c.recompute == "full" and c.recompute_fraction < 1.0:
        recompute = f"full({c.recompute_fraction:g})"
    return (f"dp={c.dp} tp={c.tp} pp={c.pp} v={c.virtual_stages} mb={c.micro_batch} "
            f"acc={c.num_microbatches} recompute={recompute} zero={c.zero_stage}"
            f"{' offload' if c.offload else ''}")


# ---------------------------------------------------------------- cost model


def _allreduce_s(nbytes: float, ranks: int, gbps: float, alpha: float) -> float:
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) / ranks * nbytes / (gbps * 1e9) + 2 * (ranks - 1) * alpha


def _gather_s(nbytes: float, ranks: int, gbps: float, alpha: float) -> float:
    """All-gather or reduce-scatter of a buffer of ``nbytes`` in total."""
    if ranks <= 1:
        return 0.0
    return (ranks - 1) / ranks * nbytes / (gbps * 1e9) + (ranks - 1) * alpha


def step_time(model: GPTConfig, cfg: ParallelConfig, device: DeviceType, devices_per_node: int,
              cost: CostModel = CostModel()) -> tuple[float, dict[str, float]]:
    """Predicted seconds per optimizer step and its parts."""
    s, b, h, t = model.seq, cfg.micro_batch, model.hidden, cfg.tp
    e = cfg.precision.activation_bytes
    tokens = b * s
    efficiency = (cost.max_efficiency * tokens / (tokens + cost.tokens_half)
                  * (h / t) / (h / t + cost.width_half))
    flop_rate = device.peak_tflops * 1e12 * efficiency
    layer_fwd = 24.0 * b * s * h * h * (1.0 + s / (6.0 * h))
    full_share = cfg.recompute_fraction if cfg.recompute == "full" else 0.0
    extra = full_share * layer_fwd
    if cfg.recompute == "selective":
        extra += 4.0 * b * s * s * h * cfg.recompute_fraction
    layers_per_device = model.layers / cfg.pp
    logits = 6.0 * b * s * h * model.vocab
    compute = (layers_per_device * (3 * layer_fwd + extra) + logits) / t / flop_rate

    intra, inter = device.intra_node_gbps, device.inter_node_gbps
    tp_allreduces = layers_per_device * (4 + 2 * full_share)
    tensor = tp_allreduces * _allreduce_s(e * b * s * h, t, intra, cost.alpha_intra_s)
    p2p = 0.0
    if cfg.pp > 1:
        spans_nodes = t * cfg.pp > devices_per_node
        gbps, alpha = (inter, cost.alpha_inter_s) if spans_nodes else (intra, cost.alpha_intra_s)
        p2p = 2 * cfg.virtual_stages * (alpha + e * b * s * h / t / (gbps * 1e9))
    slots = cfg.num_microbatches + (cfg.pp - 1) / cfg.virtual_stages
    pipeline = slots * (compute + tensor + p2p)

    params = _device_parameters(model, cfg)
    dp = cfg.dp
    dp_spans_nodes = t * cfg.pp * dp > devices_per_node
    gbps, alpha = (inter, cost.alpha_inter_s) if dp_spans_nodes else (intra, cost.alpha_intra_s)
    p_bytes, g_bytes = cfg.precision.param_bytes * params, cfg.precision.grad_bytes * params
    m = cfg.num_microbatches
    if cfg.zero_stage <= 1:
        data = _allreduce_s(g_bytes, dp, gbps, alpha)
    elif cfg.zero_stage == 2:
        data = m * _gather_s(g_bytes, dp, gbps, alpha) + _gather_s(p_bytes, dp, gbps, alpha)
    else:
        data = m * (2 * _gather_s(p_bytes, dp, gbps, alpha) + _gather_s(g_bytes, dp, gbps, alpha))
    offload = 0.0
    if cfg.offload:
        shard = params / dp if cfg.zero_stage >= 1 else params
        moved = shard * (cfg.precision.param_bytes + cfg.precision.grad_bytes)
        offload = moved / (cost.host_gbps * 1e9) + shard / cost.cpu_adam_params_per_s
    total = pipeline + data + offload
    return total, {"compute": slots * compute, "tensor_parallel": slots * tensor,
                   "pipeline_p2p": slots * p2p,
                   "bubble": (cfg.pp - 1) / cfg.virtual_stages * (compute + tensor + p2p),
                   "data_parallel": data, "offload": offload}


def _device_parameters(model: GPTConfig, cfg: ParallelConfig) -> float:
    h = model.hidden
    per_layer = (12 * h * h + 7 * h) / cfg.tp + 6 * h
    return model.layers / cfg.pp * per_layer + model.vocab * h / cfg.tp + model.seq * h


# ---------------------------------------------------------------- search


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _powers_of_two_dividing(n: int, limit: int) -> list[int]:
    out, value = [], 1
    while value <= min(n, limit):
        if n % value == 0:
            out.append(value)
        value *= 2
    return out


def _recompute_options(space: SearchSpace) -> list[tuple[RecomputePolicy, float]]:
    options: list[tuple[RecomputePolicy, float]] = []
    for policy in space.recompute:
        if policy == "full":
            options.extend(("full", f) for f in space.full_recompute_fractions)
        else:
            options.append((policy, 1.0))
    return options


def _search_structure(model: GPTConfig, structure: ParallelConfig, device: DeviceType,
                      devices_per_node: int, global_batch: int, space: SearchSpace,
                      cost: CostModel, capacity: float, plans: list[Plan],
                      rejected: list[Rejection]) -> int:
    """Recompute and sharding choices for one set of degrees and micro-batching.

    More recomputation only adds time and saves memory, so for each sharding choice the
    recompute options are tried fastest first and the first that fits ends the scan: the
    slower ones would be dominated by it.
    """
    options = []
    for policy, fraction in _recompute_options(space):
        cfg = structure.with_(recompute=policy, recompute_fraction=fraction)
        options.append((step_time(model, cfg, device, devices_per_node, cost)[0], cfg))
    options.sort(key=lambda item: item[0])
    # The option that keeps the least memory is the same whatever the sharding: if it does not
    # fit, no recompute option does.
    leanest = min((option for _, option in options),
                  key=lambda cfg: plan_memory(model, cfg).activations)
    considered = 0
    for zero in space.zero_stages:
        for offload in space.offload:
            if (offload and zero == 0) or (structure.dp == 1 and zero > 0 and not offload):
                continue  # offload needs a ZeRO stage; sharding over one rank changes nothing
            lean = plan_memory(model, leanest.with_(zero_stage=zero, offload=offload))
            considered += 1
            if lean.peak > capacity:
                rejected.append(Rejection(
                    f"needs {lean.peak / GIB:.1f} GiB > {capacity / GIB:.1f} GiB usable even "
                    f"with its leanest recomputation",
                    leanest.with_(zero_stage=zero, offload=offload)))
                continue
            for index, (_, option) in enumerate(options):
                cfg = option.with_(zero_stage=zero, offload=offload)
                considered += 1
                memory = plan_memory(model, cfg)
                if memory.peak > capacity:
                    rejected.append(Rejection(
                        f"needs {memory.peak / GIB:.1f} GiB > {capacity / GIB:.1f} GiB usable",
                        cfg))
                    continue
                seconds, parts = step_time(model, cfg, device, devices_per_node, cost)
                plans.append(Plan(cfg, memory, seconds, global_batch, parts))
                if index + 1 < len(options):
                    rejected.append(Rejection(
                        "dominated: a plan with less recomputation fits and is faster",
                        family=f"{describe(cfg)} with more recomputation "
                               f"({len(options) - index - 1} options)"))
                break
    return considered


def search_plans(model: GPTConfig, device: DeviceType, num_devices: int, devices_per_node: int,
                 global_batch: int, space: SearchSpace = SearchSpace(),
                 cost: CostModel = CostModel()) -> PlanSearchResult:
    """All layouts of ``model`` on ``num_devices`` devices, fitting ones ranked fastest first."""
    for name, value in (("num_devices", num_devices), ("devices_per_node", devices_per_node),
                        ("global_batch", global_batch)):
        if not isinstance(value, int) or value < 1:
            raise SpecError(f"must be a positive integer, got {value!r}", field=name)
    started = time.perf_counter()
    capacity = device.memory_gb * GIB - space.reserved_bytes
    plans: list[Plan] = []
    rejected: list[Rejection] = []
    considered = 0
    tps = _powers_of_two_dividing(num_devices, devices_per_node) if space.tensor_parallel else [1]
    for tp in tps:
        if model.heads % tp:
            rejected.append(Rejection(f"{model.heads} heads do not split over tp={tp}",
                                      family=f"tp={tp}"))
            continue
        for pp in _divisors(num_devices // tp) if space.pipeline_parallel else [1]:
            family = f"tp={tp} pp={pp}"
            if model.layers % pp:
                rejected.append(Rejection(f"{model.layers} layers do not split into {pp} stages",
                                          family=family))
                continue
            dp = num_devices // (tp * pp)
            if global_batch % dp:
                rejected.append(Rejection(
                    f"global batch {global_batch} is not divisible by dp={dp}", family=family))
                continue
            local_batch = global_batch // dp
            for micro_batch in _powers_of_two_dividing(local_batch, space.max_micro_batch):
                micro_batches = local_batch // micro_batch
                virtual = [1]
                if pp > 1 and micro_batches % pp == 0:
                    virtual += [v for v in _powers_of_two_dividing(model.layers // pp,
                                                                   space.max_virtual_stages)
                                if v > 1]
                for v in virtual:
                    structure = ParallelConfig(
                        dp=dp, tp=tp, pp=pp, virtual_stages=v, micro_batch=micro_batch,
                        num_microbatches=micro_batches,
                        sequence_parallel=space.sequence_parallel and tp > 1,
                        flash_attention=space.flash_attention, precision=space.precision)
                    considered += _search_structure(model, structure, device, devices_per_node,
                                                    global_batch, space, cost, capacity,
                                                    plans, rejected)
    plans.sort(key=lambda p: (p.step_time_s, p.memory_bytes))
    return PlanSearchResult(plans, rejected, considered, time.perf_counter() - started)


def best_plan(model: GPTConfig, device_type: DeviceType, num_devices: int, devices_per_node: int,
              global_batch: int, space: SearchSpace = SearchSpace(),
              cost: CostModel = CostModel()) -> Plan | None:
    """The fastest plan that fits, or None when no layout fits the devices' memory."""
    return search_plans(model, device_type, num_devices, devices_per_node, global_batch,
                        space, cost).best


# ---------------------------------------------------------------- any nn.Module (data parallel)


def search_module_plans(measured: MeasuredStep, device: DeviceType, num_devices: int,
                        devices_per_node: int, global_batch: int,
                        space: SearchSpace = SearchSpace(),
                        cost: CostModel = CostModel()) -> PlanSearchResult:
    """Data-parallel plans (micro-batch, accumulation, ZeRO, offload) for a measured module.

    Without an architecture the search cannot split layers or tensors; it scales the measured
    activations and backward transient linearly with the micro-batch and shards model states as
    ZeRO does, with the bytes per parameter the measurement saw.
    """
    started = time.perf_counter()
    if global_batch % num_devices:
        raise SpecError(f"global batch {global_batch} must be divisible by the {num_devices} "
                        "devices for data parallelism", field="global_batch")
    capacity = device.memory_gb * GIB - space.reserved_bytes
    n = measured.num_parameters
    param_bytes = measured.params / n
    precision = Precision("measured", round(param_bytes), round(param_bytes),
                          round(measured.optimizer / n), 2)
    transient = max(0.0, measured.peak - measured.params - measured.buffers
                    - measured.optimizer - measured.activations) / measured.micro_batch
    per_sample = measured.activations_per_sample + transient
    dp, local = num_devices, global_batch // num_devices
    gbps = device.inter_node_gbps if dp > devices_per_node else device.intra_node_gbps
    alpha = cost.alpha_inter_s if dp > devices_per_node else cost.alpha_intra_s
    plans: list[Plan] = []
    rejected: list[Rejection] = []
    for micro_batch in _powers_of_two_dividing(local, space.max_micro_batch):
        accumulation = local // micro_batch
        for zero in space.zero_stages:
            for offload in space.offload:
                if (offload and zero == 0) or (dp == 1 and zero > 0 and not offload):
                    continue
                cfg = ParallelConfig(dp=dp, micro_batch=micro_batch,
                                     num_microbatches=accumulation, zero_stage=zero,
                                     offload=offload, precision=precision)
                states = model_state_bytes(n, zero, dp, precision, offload)
                activations = per_sample * micro_batch
                peak = measured.buffers + states.total + activations
                memory = MemoryEstimate(states.params, states.grads, states.optimizer,
                                        measured.activations_per_sample * micro_batch, 0.0,
                                        transient * micro_batch, 0.0, states.host_optimizer,
                                        peak)
                if peak > capacity:
                    rejected.append(Rejection(
                        f"needs {peak / GIB:.1f} GiB > {capacity / GIB:.1f} GiB usable", cfg))
                    continue
                tokens_factor = micro_batch / (micro_batch + 1.0)
                rate = device.peak_tflops * 1e12 * cost.max_efficiency * tokens_factor
                compute = accumulation * measured.flops_per_sample * micro_batch / rate
                g_bytes = precision.grad_bytes * n
                if zero <= 1:
                    data = _allreduce_s(g_bytes, dp, gbps, alpha)
                else:
                    rounds = accumulation * (3 if zero == 3 else 1)
                    data = rounds * _gather_s(g_bytes, dp, gbps, alpha)
                host = 0.0
                if offload:
                    shard = n / dp
                    host = (shard * 2 * param_bytes / (cost.host_gbps * 1e9)
                            + shard / cost.cpu_adam_params_per_s)
                parts = {"compute": compute, "data_parallel": data, "offload": host}
                plans.append(Plan(cfg, memory, compute + data + host, global_batch, parts))
    plans.sort(key=lambda p: (p.step_time_s, p.memory_bytes))
    return PlanSearchResult(plans, rejected, len(plans) + len(rejected),
                            time.perf_counter() - started)
