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
FSDP all-gather/reduce-scatter buffers, the optimizer-step transient, and what backward adds:
it is walked layer by layer (activations freed and gradients left by the layers done, the
running layer's transient, the float32 logits gradients), so that gradients during backward and
fractions of recomputed layers are counted where they occur.
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


def _layer_transients(model: GPTConfig, cfg: ParallelConfig) -> dict[str, float]:
    """Extra memory while one layer's backward runs, on top of the activations still saved.

    ``plain``: the gradient of the layer output and of the widest MLP tensor (``4h``) at the
    start of the layer's backward, or one attention-score gradient once the MLP's saved tensors
    are freed, whichever is larger; ``full``: the rebuilt layer on top of that; ``selective``:
    the rebuilt attention core on top of that.
    """
    s, b, h, a, t = model.seq, cfg.micro_batch, model.hidden, model.heads, cfg.tp
    e, m = cfg.precision.activation_bytes, cfg.precision.mask_bytes
    sp = t if cfg.sequence_parallel else 1
    sbh = s * b * h
    score = 0.0 if cfg.flash_attention else e * a * s * s * b / t
    # The MLP, projection and their masks are freed before the attention's backward runs.
    freed_before_attention = ((10 * e + 2) * sbh) / sp + e * sbh / t
    start = e * sbh / sp + 4 * e * sbh / t
    attention = score - freed_before_attention + e * sbh / sp
    plain = max(start, attention)
    rebuilt = _per_layer(model, cfg, b, "none") + 4 * NORM_STAT_BYTES * s * b / sp
    rebuilt -= e * sbh / sp  # the layer input is the checkpoint already kept
    core = 0.0 if cfg.flash_attention else (2 * e + m) * a * s * s * b / t
    return {"plain": plain, "full": rebuilt + plain, "selective": core + plain}


@dataclass(frozen=True, slots=True)
class _BackwardEvent:
    """One moment of backward on a stage: what activations hold then, and where backward is."""

    activations: float  # saved activations still held plus the transient of this moment
    done_layers: int  # layers whose backward has finished (their gradients exist)
    in_layer: bool  # inside a layer's backward: its gradients and FSDP unit are live
    has_prefetch: bool  # FSDP gathers the next layer (in backward order) meanwhile
    output_grads: bool  # the output layer's (tied embedding's) gradients exist
    layer_end: bool = False  # the layer's backward is complete: all its gradients, no activations


def _backward_events(model: GPTConfig, cfg: ParallelConfig, first: bool, last: bool,
                     per_microbatch: float, in_flight: float) -> tuple[_BackwardEvent, ...]:
    """The moments of one micro-batch's backward at which the stage's memory can peak.

    Backward runs through the layers from the last one: each finished layer frees its saved
    activations and leaves its gradients. The recomputed layers are the first ones of the stage,
    so their backward runs after all other layers'. Within a run of alike layers the memory
    changes by the same amount per layer, so the run's ends bound it (the first layer of the
    backward has no reduce-scatter in flight yet, the stage's first layer nothing to prefetch).
    """
    s, b, h, t = model.seq, cfg.micro_batch, model.hidden, cfg.tp
    e, m = cfg.precision.activation_bytes, cfg.precision.mask_bytes
    sp = t if cfg.sequence_parallel else 1
    others = (in_flight - 1.0) * per_microbatch  # micro-batches waiting for their backward
    norm_stats = 2 * 2 * NORM_STAT_BYTES * s * b / sp
    saved = {"none": _per_layer(model, cfg, b, "none") + norm_stats}
    if cfg.recompute != "none":
        saved[cfg.recompute] = _per_layer(model, cfg, b, cfg.recompute)
        if cfg.recompute != "full":
            saved[cfg.recompute] += norm_stats
    transient = _layer_transients(model, cfg)
    recomputed, plain = _layer_counts(model, cfg)
    layers = round(recomputed + plain)
    n_recomputed = round(recomputed)
    base = others + (m * s * b * h / sp if first else 0.0)  # embedding dropout mask
    events = [_BackwardEvent(others + per_microbatch, 0, False, layers > 0, False)]
    if last:  # the float32 log-softmax and logits gradients with every activation still held
        events.append(_BackwardEvent(others + per_microbatch
                                     + 2 * LOGITS_BYTES * s * b * model.vocab / t,
                                     0, False, layers > 0, False))
    candidates = {0, 1, layers - 2, layers - 1}  # the last one has no later unit to prefetch
    if 0 < n_recomputed < layers:
        done_plain = layers - n_recomputed
        candidates |= {done_plain - 1, done_plain, done_plain + 1}
    for done in sorted(d for d in candidates if 0 <= d < layers):
        index = layers - 1 - done  # the layer whose backward runs
        policy = cfg.recompute if index < n_recomputed else "none"
        kept = min(index + 1, n_recomputed) * saved.get(cfg.recompute, 0.0)
        kept += max(0, index + 1 - n_recomputed) * saved["none"]
        key = "plain" if policy == "none" else policy
        events.append(_BackwardEvent(base + kept + transient[key], done, True, index > 0,
                                     last))
        # When the layer's backward ends its activations are gone and the gradient of its input
        # is left; all its gradients exist (under FSDP, unsharded and copied for reduce-scatter).
        kept -= saved[cfg.recompute if index < n_recomputed else "none"]
        events.append(_BackwardEvent(base + kept + e * s * b * h / sp, done, True, index > 0,
                                     last, layer_end=True))
    return tuple(events)


def _optimizer_transient(model: GPTConfig, cfg: ParallelConfig, offload: bool) -> float:
    """Adam's per-tensor temporaries (two float32 tensors of the largest parameter shard).

    ZeRO-1 and ZeRO-2 assign whole parameters to ranks (``ZeroRedundancyOptimizer``), so the
    largest parameter is updated whole; ZeRO-3 (FSDP) shards every parameter.
    """
    if offload:
        return 0.0
    largest = max(4 * model.hidden * model.hidden, model.vocab * model.hidden) / cfg.tp
    if cfg.zero_stage >= 3:
        largest /= cfg.dp
    return 2 * 4 * largest


def _layer_parameters(model: GPTConfig, cfg: ParallelConfig) -> float:
    """Parameters of one transformer layer on one device (as ``_stage_parameters``)."""
    h = model.hidden
    return (12 * h * h + 7 * h) / cfg.tp + 6 * h


def fsdp_unit_buffer_bytes(model: GPTConfig, cfg: ParallelConfig) -> float:
    """ZeRO-3/FSDP: the most unsharded memory at once in backward.

    The gathered current and prefetched layer, the current layer's unsharded gradient, the
    previous layer's reduce-scatter input and the root unit (embeddings and final norm), which
    stays unsharded from forward to the end of backward.
    """
    if cfg.zero_stage < 3 or cfg.dp == 1:
        return 0.0
    unit = _layer_parameters(model, cfg)
    p, g = cfg.precision.param_bytes, cfg.precision.grad_bytes
    root = _stage_parameters(model, cfg, True, cfg.pp == 1) - model.layers / cfg.pp * unit
    return unit * (2 * p + 2 * g) + root * p


_ACTIVATION_CACHE: dict[tuple, tuple[float, tuple[_BackwardEvent, ...]]] = {}


def _activation_side(model: GPTConfig, cfg: ParallelConfig, first: bool,
                     last: bool) -> tuple[float, tuple[_BackwardEvent, ...]]:
    """(saved activations, backward moments) on one stage; independent of ZeRO and offload."""
    key = (model, cfg.tp, cfg.pp, cfg.virtual_stages, cfg.micro_batch, cfg.num_microbatches,
           cfg.recompute, cfg.recompute_fraction, cfg.sequence_parallel, cfg.flash_attention,
           cfg.precision, first, last)
    cached = _ACTIVATION_CACHE.get(key)
    if cached is None:
        if len(_ACTIVATION_CACHE) > 100_000:
            _ACTIVATION_CACHE.clear()
        in_flight = (in_flight_microbatches(cfg.pp, cfg.num_microbatches, cfg.virtual_stages)
                     if first else 1.0)
        per_microbatch = activation_bytes_per_microbatch(model, cfg, first, last)
        cached = (in_flight * per_microbatch,
                  _backward_events(model, cfg, first, last, per_microbatch, in_flight))
        _ACTIVATION_CACHE[key] = cached
    return cached


def _during_backward(model: GPTConfig, cfg: ParallelConfig, event: _BackwardEvent,
                     stage_params: float, grads: float) -> tuple[float, float]:
    """(activations + gradients, FSDP buffers) at one moment of backward on one stage.

    Gradients exist in full from the start when an earlier micro-batch left them (accumulation,
    pipelining) or when DDP keeps its gradient buckets between steps (ZeRO 0 and 1 with data
    parallelism); otherwise only those of the layers done so far (partitioned under ZeRO-2 and
    sharded under ZeRO-3), of the output layer and of the layer whose backward runs.
    """
    fsdp = cfg.zero_stage >= 3 and cfg.dp > 1
    unit = _layer_parameters(model, cfg)
    root = stage_params - model.layers / cfg.pp * unit
    p, g = cfg.precision.param_bytes, cfg.precision.grad_bytes
    shard = 1.0 / cfg.dp if cfg.zero_stage >= 2 else 1.0
    persistent = (cfg.num_microbatches > 1 or cfg.pp > 1
                  or (cfg.dp > 1 and cfg.zero_stage < 2))
    # The layer's gradients while its backward runs: the largest weight gradient (an MLP
    # matrix, produced first) at the start, all of them at the end.
    largest = 4 * model.hidden**2 / cfg.tp * g
    current = 0.0
    if event.in_layer:
        current = unit * g * (1.0 if fsdp else shard) if event.layer_end else largest
    if persistent:
        held = grads
    else:
        held = event.done_layers * unit * g * shard
        if event.output_grads:  # FSDP's root keeps its gradients unsharded until the end
            held += root * g * (1.0 if fsdp else shard)
        if not fsdp:
            held += current
    if cfg.zero_stage == 2 and cfg.dp > 1 and event.in_layer and not event.layer_end:
        # ZeRO-2 reduces each new gradient from a scaled copy before keeping or dropping it.
        held += largest * (2 if persistent else 1)
    buffers = 0.0
    if fsdp:
        buffers = root * p
        units = (1 if event.in_layer else 0) + (1 if event.has_prefetch else 0)
        buffers += units * unit * p + current
        # A reduce-scatter input: the one the layer's gradients are copied into when its
        # backward ends, else the previous layer's, still in flight.
        if event.layer_end or (event.in_layer and event.done_layers > 0):
            buffers += unit * g
    return event.activations + held, buffers


def plan_memory(model: GPTConfig, cfg: ParallelConfig) -> MemoryEstimate:
    """Peak bytes on the most loaded device: first or last pipeline stage, whichever is larger."""
    estimates = []
    stages = [(True, True)] if cfg.pp == 1 else [(True, False), (False, True)]
    for first, last in stages:
        params = _stage_parameters(model, cfg, first, last)
        states = model_state_bytes(params, cfg.zero_stage, cfg.dp, cfg.precision, cfg.offload)
        activations, events = _activation_side(model, cfg, first, last)
        opt = _optimizer_transient(model, cfg, cfg.offload)
        during_backward, buffers = 0.0, 0.0
        for event in events:
            held, event_buffers = _during_backward(model, cfg, event, params, states.grads)
            if held + event_buffers > during_backward:
                during_backward, buffers = held + event_buffers, event_buffers
        persistent = states.grads if (cfg.num_microbatches > 1 or cfg.pp > 1 or (
            cfg.dp > 1 and cfg.zero_stage < 2)) else 0.0
        optimizer_step = states.grads + opt
        peak = states.params + states.optimizer + max(during_backward, optimizer_step)
        estimates.append(MemoryEstimate(
            params=states.params, grads=states.grads, optimizer=states.optimizer,
            activations=activations, fsdp_buffers=buffers,
            backward_transient=during_backward - activations - persistent - buffers,
            optimizer_transient=opt, host_bytes=states.host_optimizer, peak=peak,
        ))
    return max(estimates, key=lambda est: est.peak)
