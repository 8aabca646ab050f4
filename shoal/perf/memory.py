"""Per-device memory of a training plan for a GPT-layout transformer.

Published formulas, each reproduced exactly by a function below (see tests/perf_memory):

* model states (Rajbhandari et al., ZeRO, 2020): ``(p + g + k)P`` bytes for ``P`` parameters,
  ``p``/``g`` bytes per parameter and gradient and ``k`` bytes of optimizer state (16 bytes per
  parameter for mixed-precision Adam); ZeRO-1 ``(p+g)P + kP/N``, ZeRO-2 ``pP + (g+k)P/N``,
  ZeRO-3/FSDP ``(p+g+k)P/N`` over ``N`` data-parallel ranks;
* activations per transformer layer (Korthikanti et al. 2022, Table 2), with 2-byte activations
  and 1-byte dropout masks: ``sbh(34 + 5as/h)`` without parallelism, ``sbh(10 + 24/t + 5as/(ht))``
  with tensor parallel ``t``, ``sbh/t (34 + 5as/h)`` with sequence parallel as well, selective
  recompute drops the ``5as/h`` term, full recompute keeps ``2sbh`` (``2sbh/t`` with sequence
  parallel); the first pipeline stage holds ``p`` micro-batches in flight under 1F1B, times
  ``1 + (p-1)/(pv)`` with ``v`` interleaved (virtual) stages.

The formulas are generalised to any activation element size ``e`` (``34 = 16e + 2m``,
``5 = 2e + m`` with mask size ``m``) so that a float32 CPU run can be compared exactly. The
terms the per-layer formulas leave out are added separately: embedding dropout on the first
stage, final norm, output layer and float32 logits on the last stage, layer-norm statistics,
FSDP all-gather/reduce-scatter buffers, the backward transient (the float32 logits gradient, the
layer being recomputed, one attention-score gradient) and the optimizer-step transient.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from shoal.perf.models import GPTConfig

RecomputePolicy = Literal["none", "selective", "full"]
RECOMPUTE_POLICIES: tuple[RecomputePolicy, ...] = ("none", "selective", "full")


@dataclass(frozen=True, slots=True)
class Precision:
    """Bytes per parameter / gradient / optimizer state, per activation element and mask."""

    name: str
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    mask_bytes: int = 1

    @property
    def model_state_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes


# fp16/bf16 weights and gradients, fp32 master weights + Adam moments (K = 12 in ZeRO).
MIXED_ADAM = Precision("mixed", 2, 2, 12, 2)
# Megatron-LM accumulates gradients in fp32 ("main_grad"): 18 bytes per parameter.
MIXED_ADAM_FP32_GRADS = Precision("mixed-fp32-grads", 2, 4, 12, 2)
# Everything in fp32 with Adam's two moments, as in the CPU checks.
FP32_ADAM = Precision("fp32", 4, 4, 8, 4)
PRECISIONS = {p.name: p for p in (MIXED_ADAM, MIXED_ADAM_FP32_GRADS, FP32_ADAM)}

LOGITS_BYTES = 4  # cross-entropy runs on float32 logits
NORM_STAT_BYTES = 4  # layer norm keeps float32 mean and reciprocal std per token


# ---------------------------------------------------------------- published formulas


@dataclass(frozen=True, slots=True)
class ModelStates:
    params: float
    grads: float
    optimizer: float
    host_optimizer: float = 0.0  # optimizer state moved to CPU memory by offload

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def model_state_bytes(num_params: float, zero_stage: int, dp: int,
                      precision: Precision = MIXED_ADAM,
                      offload_optimizer: bool = False) -> ModelStates:
    """ZeRO's model-state memory per device (Rajbhandari et al. 2020, section 5 / Table 1)."""
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage}")
    if dp < 1:
        raise ValueError(f"dp must be >= 1, got {dp}")
    p = precision.param_bytes * num_params
    g = precision.grad_bytes * num_params
    k = precision.optimizer_bytes * num_params
    params = p / dp if zero_stage >= 3 else p
    grads = g / dp if zero_stage >= 2 else g
    optimizer = k / dp if zero_stage >= 1 else k
    if offload_optimizer:
        return ModelStates(params, grads, 0.0, host_optimizer=optimizer)
    return ModelStates(params, grads, optimizer)


def layer_activation_bytes(seq: int, micro_batch: int, hidden: int, heads: int, tp: int = 1,
                           sequence_parallel: bool = False,
                           recompute: RecomputePolicy = "none",
                           flash_attention: bool = False,
                           activation_bytes: int = 2, mask_bytes: int = 1) -> float:
    """Activations one transformer layer keeps for backward (Korthikanti et al. 2022, Table 2).

    With the defaults (2-byte activations, 1-byte masks) this is exactly the paper's
    ``sbh(10 + 24/t + 5as/(ht))`` family. Flash/fused attention keeps no ``as^2b`` matrices,
    only float32 softmax statistics (``4asb`` bytes, split over ``t``).
    """
    s, b, h, a, t = seq, micro_batch, hidden, heads, tp
    e, m = activation_bytes, mask_bytes
    sbh = s * b * h
    if recompute == "full":
        return e * sbh / (t if sequence_parallel else 1)
    # Replicated under tensor parallelism (unless sequence parallel): the two layer-norm inputs,
    # the QKV and first-MLP inputs (e each) and the two dropout masks; split: Q, K, V, the
    # projection input, the GELU input and the second-MLP input (12e).
    replicated = (4 * e + 2 * m) * sbh
    split = 12 * e * sbh / t
    if sequence_parallel:
        replicated /= t
    if recompute == "selective":
        attention = 0.0
    elif flash_attention:
        attention = NORM_STAT_BYTES * a * s * b / t
    else:
        attention = (2 * e + m) * a * s * s * b / t
    return replicated + split + attention


def in_flight_microbatches(pp: int, num_microbatches: int, virtual_stages: int = 1) -> float:
    """Micro-batches whose activations the first pipeline stage holds at once (1F1B).

    ``p`` for the plain 1F1B schedule (each of ``L/p`` layers); ``p (1 + (p-1)/(pv))`` with ``v``
    interleaved model chunks per device (Korthikanti et al. 2022, section 4.2.3).
    """
    if pp <= 1:
        return 1.0
    in_flight = min(pp, num_microbatches)
    if virtual_stages > 1:
        return in_flight * (1.0 + (pp - 1) / (pp * virtual_stages))
    return float(in_flight)


# ---------------------------------------------------------------- a whole plan


@dataclass(frozen=True, slots=True)
class ParallelConfig:
    """How a job is laid out: degrees, micro-batching, recomputation, sharding, precision."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    virtual_stages: int = 1
    micro_batch: int = 1
    num_microbatches: int = 1  # per optimizer step and data-parallel rank (accumulation steps)
    recompute: RecomputePolicy = "none"
    recompute_fraction: float = 1.0  # share of each stage's layers that use ``recompute``
    zero_stage: int = 0
    offload: bool = False
    sequence_parallel: bool = False
    flash_attention: bool = False
    precision: Precision = MIXED_ADAM

    def with_(self, **changes: object) -> ParallelConfig:
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """Predicted bytes on the most loaded device (``peak``) and the parts it is made of."""

    params: float
    grads: float
    optimizer: float
    activations: float
    fsdp_buffers: float
    backward_transient: float
    optimizer_transient: float
    host_bytes: float
    peak: float

    @property
    def model_states(self) -> float:
        return self.params + self.grads + self.optimizer


def _stage_parameters(model: GPTConfig, cfg: ParallelConfig, first: bool, last: bool) -> float:
    h, t = model.hidden, cfg.tp
    # Weights and the QKV / first-MLP biases split over t; norms and other biases replicated.
    per_layer = (12 * h * h + 7 * h) / t + 6 * h
    params = model.layers / cfg.pp * per_layer
    if first:
        params += model.vocab * h / t + model.seq * h
    if last:
        params += model.final_norm_parameters
        if not first:  # the tied output layer keeps its own copy of the word embeddings
            params += model.vocab * h / t
    return params


def _layer_counts(model: GPTConfig, cfg: ParallelConfig) -> tuple[float, float]:
    """(layers using cfg.recompute, layers without recomputation) on one device."""
    per_device = model.layers / cfg.pp
    if cfg.recompute == "none":
        return 0.0, per_device
    recomputed = round(cfg.recompute_fraction * per_device)
    return float(recomputed), per_device - recomputed


def _per_layer(model: GPTConfig, cfg: ParallelConfig, micro_batch: int,
               recompute: RecomputePolicy) -> float:
    e, m = cfg.precision.activation_bytes, cfg.precision.mask_bytes
    return layer_activation_bytes(model.seq, micro_batch, model.hidden, model.heads, cfg.tp,
                                  cfg.sequence_parallel, recompute, cfg.flash_attention, e, m)


def activation_bytes_per_microbatch(model: GPTConfig, cfg: ParallelConfig, first: bool,
                                    last: bool) -> float:
    """Everything one micro-batch leaves saved for backward on one pipeline stage."""
    s, b, h = model.seq, cfg.micro_batch, model.hidden
    e, m = cfg.precision.activation_bytes, cfg.precision.mask_bytes
    sp = cfg.tp if cfg.sequence_parallel else 1
    recomputed, plain = _layer_counts(model, cfg)
    total = recomputed * _per_layer(model, cfg, b, cfg.recompute)
    total += plain * _per_layer(model, cfg, b, "none")
    # Two layer norms per layer keep float32 mean and rstd, unless the layer is fully recomputed.
    norms = plain + (recomputed if cfg.recompute != "full" else 0.0)
    total += norms * 2 * 2 * NORM_STAT_BYTES * s * b / sp
    if first:
        total += m * s * b * h / sp  # embedding dropout mask
    if last:
        total += 2 * e * s * b * h / sp  # final-norm input and output-layer input
        total += 2 * NORM_STAT_BYTES * s * b / sp
        total += LOGITS_BYTES * s * b * model.vocab / cfg.tp  # float32 log-softmax output
    return total


def _backward_transient(model: GPTConfig, cfg: ParallelConfig, last: bool) -> float:
    """Extra memory at the worst moment of backward, on top of the saved activations."""
    s, b, h, a, t = model.seq, cfg.micro_batch, model.hidden, model.heads, cfg.tp
    e, m = cfg.precision.activation_bytes, cfg.precision.mask_bytes
    sp = t if cfg.sequence_parallel else 1
    sbh = s * b * h
    score = 0.0 if cfg.flash_attention else e * a * s * s * b / t
    # The MLP, projection and their masks are freed before the attention's backward runs.
    freed_before_attention = ((10 * e + 2) * sbh) / sp + e * sbh / t
    candidates = [0.0]
    if last:  # gradients of the float32 log-softmax output and of the logits
        candidates.append(2 * LOGITS_BYTES * s * b * model.vocab / t)
    recomputed, plain = _layer_counts(model, cfg)
    if plain:
        candidates.append(score - freed_before_attention + e * sbh / sp)
    if recomputed and cfg.recompute == "full":
        rebuilt = _per_layer(model, cfg, b, "none") + 4 * NORM_STAT_BYTES * s * b / sp
        rebuilt -= e * sbh / sp  # the layer input is the checkpoint already kept
        candidates.append(rebuilt + e * sbh / sp)
        candidates.append(rebuilt + score - freed_before_attention + e * sbh / sp)
    if recomputed and cfg.recompute == "selective":
        core = 0.0 if cfg.flash_attention else (2 * e + m) * a * s * s * b / t
        candidates.append(core + score - freed_before_attention + e * sbh / sp)
    return max(candidates)


def _optimizer_transient(model: GPTConfig, cfg: ParallelConfig, offload: bool) -> float:
    """Adam's per-tensor temporaries (two float32 tensors of the largest parameter shard)."""
    if offload:
        return 0.0
    largest = max(4 * model.hidden * model.hidden, model.vocab * model.hidden) / cfg.tp
    if cfg.zero_stage >= 1:
        largest /= cfg.dp
    return 2 * 4 * largest


def fsdp_unit_buffer_bytes(model: GPTConfig, cfg: ParallelConfig) -> float:
    """ZeRO-3/FSDP: the gathered current and prefetched layer plus one unsharded gradient."""
    if cfg.zero_stage < 3 or cfg.dp == 1:
        return 0.0
    unit = (12 * model.hidden**2 + 13 * model.hidden) / cfg.tp
    unit = max(unit, model.vocab * model.hidden / cfg.tp)  # the embedding is a unit too
    return unit * (2 * cfg.precision.param_bytes + cfg.precision.grad_bytes)


_ACTIVATION_CACHE: dict[tuple, tuple[float, float]] = {}


def _activation_side(model: GPTConfig, cfg: ParallelConfig, first: bool,
                     last: bool) -> tuple[float, float]:
    """(saved activations, backward transient) on one stage; independent of ZeRO and offload."""
    key = (model, cfg.tp, cfg.pp, cfg.virtual_stages, cfg.micro_batch, cfg.num_microbatches,
           cfg.recompute, cfg.recompute_fraction, cfg.sequence_parallel, cfg.flash_attention,
           cfg.precision, first, last)
    cached = _ACTIVATION_CACHE.get(key)
    if cached is None:
        if len(_ACTIVATION_CACHE) > 100_000:
            _ACTIVATION_CACHE.clear()
        in_flight = (in_flight_microbatches(cfg.pp, cfg.num_microbatches, cfg.virtual_stages)
                     if first else 1.0)
        activations = in_flight * activation_bytes_per_microbatch(model, cfg, first, last)
        cached = (activations, _backward_transient(model, cfg, last))
        _ACTIVATION_CACHE[key] = cached
    return cached


def plan_memory(model: GPTConfig, cfg: ParallelConfig) -> MemoryEstimate:
    """Peak bytes on the most loaded device: first or last pipeline stage, whichever is larger."""
    estimates = []
    stages = [(True, True)] if cfg.pp == 1 else [(True, False), (False, True)]
    for first, last in stages:
        params = _stage_parameters(model, cfg, first, last)
        states = model_state_bytes(params, cfg.zero_stage, cfg.dp, cfg.precision, cfg.offload)
        activations, bwd = _activation_side(model, cfg, first, last)
        buffers = fsdp_unit_buffer_bytes(model, cfg)
        opt = _optimizer_transient(model, cfg, cfg.offload)
        # Gradients are present during backward only when an earlier micro-batch left them.
        grads_in_backward = states.grads if (cfg.num_microbatches > 1 or cfg.pp > 1) else 0.0
        during_backward = activations + bwd + grads_in_backward + buffers
        optimizer_step = states.grads + opt
        peak = states.params + states.optimizer + max(during_backward, optimizer_step)
        estimates.append(MemoryEstimate(
            params=states.params, grads=states.grads, optimizer=states.optimizer,
            activations=activations, fsdp_buffers=buffers, backward_transient=bwd,
            optimizer_transient=opt, host_bytes=states.host_optimizer, peak=peak,
        ))
    return max(estimates, key=lambda est: est.peak)
