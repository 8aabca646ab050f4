"""Apply a parallel plan to a real PyTorch model: recomputation, sharding, micro-batching.

A plan is what ``shoal.perf.parallel`` returns (``Plan``, ``ParallelConfig``) or one entry of
``shoal plan --json`` (``dp, tp, pp, micro_batch, accumulation, recompute, recompute_fraction,
zero_stage, offload``). ``apply_plan`` turns it into PyTorch mechanisms:

* recompute ``full`` (for the first ``round(recompute_fraction * L)`` of the ``L`` layers): the
  layer's forward runs under ``torch.utils.checkpoint`` (non-reentrant), keeping only its input;
* recompute ``selective``: the attention core (QK^T, softmax, dropout, times V) of each layer is
  recomputed, as in Korthikanti et al. 2022. Where the layer has the core as a submodule (by
  default ``shoal.train.plan.AttentionCore``, or the ``attention_core`` type or predicate given),
  that submodule runs under ``torch.utils.checkpoint``, which keeps exactly what the memory model
  counts. Otherwise the whole layer runs under selective activation checkpointing
  (``torch.utils.checkpoint.create_selective_checkpoint_contexts``) with an operator policy that
  keeps the outputs of matrix multiplications, normalisations and activation functions
  (``SELECTIVE_SAVE_OPS``) and recomputes everything else: the attention scores, softmax,
  dropout and ``scaled_dot_product_attention`` kernels and the cheap pointwise operators;
* ``zero_stage`` 3: FSDP2 (``torch.distributed.fsdp.fully_shard``) on every layer and on the
  root, parameters resharded after forward;
* ``zero_stage`` 2 (as in ZeRO and DeepSpeed): parameters replicated, optimizer state and
  gradients partitioned by parameter. ``ZeroRedundancyOptimizer`` assigns each parameter to one
  rank, which keeps its optimizer state and updates it; every gradient is reduced to its owner
  as soon as backward produces it (a hook per parameter) and dropped on the other ranks, so a
  rank holds only its partition of the gradients; after the step the owners broadcast the
  updated parameters. Every rank must produce a gradient for every parameter;
* ``zero_stage`` 1: ``DistributedDataParallel`` with ``ZeroRedundancyOptimizer`` (optimizer
  state partitioned); ``zero_stage`` 0: ``DistributedDataParallel``;
* ``offload``: FSDP2 with ``CPUOffloadPolicy`` (sharded parameters, gradients and the optimizer
  step on the host; parameters stay unsharded between forward and backward below ZeRO-3); on a
  CPU device everything already lives in host memory;
* ``micro_batch`` and ``accumulation``: ``AppliedPlan.step`` cuts this rank's share of a global
  batch into micro-batches and accumulates their gradients before one optimizer step.
  Under DDP (ZeRO 0/1) gradient all-reduce is skipped on all but the last micro-batch; under
  ZeRO-2 and FSDP gradients are reduced after every micro-batch so that only the partitioned
  gradient stays resident, which is the memory ``shoal.perf.memory`` predicts (for FSDP,
  ``sync_every_microbatch=False`` keeps unsharded gradients instead and reduces once).

Tensor and pipeline parallelism (``tp > 1``, ``pp > 1``) are not provided by this library;
``apply_plan`` rejects such plans with an error that names the field.

A job asks for a plan with ``get_plan``: the plan the scheduler chose for the job's allocation
(``SHOAL_PLAN``: one plan as JSON, a ``{"plans": [...]}`` document or the path of such a file)
or, when the job runs outside shoal, the plan the script passes as its default.

    import shoal.train as st
    plan = st.get_plan(default={"micro_batch": 4, "accumulation": 8, "recompute": "selective"})
    applied = st.apply_plan(model, plan)        # after torch.distributed.init_process_group
    optimizer = applied.optimizer(torch.optim.AdamW, lr=3e-4)
    for batch in loader:                        # each rank's share: micro_batch * accumulation
        loss = applied.step(batch, optimizer)   # model(*micro_batch) must return the loss
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

from shoal.perf.memory import FP32_ADAM, ParallelConfig, Precision
from shoal.spec.errors import SpecError
from shoal.train.env import TrainEnvError
from shoal.train.plan import AttentionCore

RECOMPUTE_NAMES = ("none", "selective", "full")
Batch = Any  # a tensor, a tuple/list of tensors or a mapping of name -> tensor
ForwardFn = Callable[[nn.Module, Batch], torch.Tensor]
CorePredicate = type | tuple[type, ...] | Callable[[nn.Module], bool]


# ---------------------------------------------------------------- the plan


@dataclass(frozen=True, slots=True)
class TrainingPlan:
    """The parts of a parallel plan that decide how one training step runs."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    virtual_stages: int = 1
    micro_batch: int = 1
    accumulation: int = 1  # micro-batches per optimizer step on each data-parallel rank
    recompute: str = "none"
    recompute_fraction: float = 1.0  # share of the layers that use ``recompute``
    zero_stage: int = 0
    offload: bool = False
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "virtual_stages", "micro_batch", "accumulation"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(f"must be a positive integer, got {value!r}", field=name)
        if self.recompute not in RECOMPUTE_NAMES:
            raise SpecError(f"must be one of {', '.join(RECOMPUTE_NAMES)} (or a fraction of "
                            f"layers such as 'full(0.5)'), got {self.recompute!r}",
                            field="recompute")
        if not 0.0 <= self.recompute_fraction <= 1.0:
            raise SpecError(f"must be within [0, 1], got {self.recompute_fraction!r}",
                            field="recompute_fraction")
        if self.zero_stage not in (0, 1, 2, 3):
            raise SpecError(f"must be 0, 1, 2 or 3, got {self.zero_stage!r}", field="zero_stage")

    @property
    def local_batch(self) -> int:
        """Samples one data-parallel rank processes per optimizer step."""
        return self.micro_batch * self.accumulation

    @property
    def global_batch(self) -> int:
        return self.dp * self.local_batch

    def recomputed_layers(self, num_layers: int) -> int:
        """How many of ``num_layers`` layers use ``recompute`` (as ``shoal.perf.memory``)."""
        if self.recompute == "none":
            return 0
        return round(self.recompute_fraction * num_layers)

    def to_parallel_config(self, precision: Precision = FP32_ADAM) -> ParallelConfig:
        """The memory model's view of this plan (float32 Adam unless told otherwise)."""
        return ParallelConfig(
            dp=self.dp, tp=self.tp, pp=self.pp, virtual_stages=self.virtual_stages,
            micro_batch=self.micro_batch, num_microbatches=self.accumulation,
            recompute=self.recompute,  # type: ignore[arg-type]
            recompute_fraction=self.recompute_fraction, zero_stage=self.zero_stage,
            offload=self.offload, sequence_parallel=self.sequence_parallel,
            precision=precision,
        )

    @classmethod
    def from_config(cls, config: ParallelConfig) -> TrainingPlan:
        return cls(dp=config.dp, tp=config.tp, pp=config.pp,
                   virtual_stages=config.virtual_stages, micro_batch=config.micro_batch,
                   accumulation=config.num_microbatches, recompute=config.recompute,
                   recompute_fraction=config.recompute_fraction, zero_stage=config.zero_stage,
                   offload=config.offload, sequence_parallel=config.sequence_parallel)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> TrainingPlan:
        """One plan as ``Plan.to_dict()`` / ``shoal plan --json`` writes it; other keys ignored."""
        if "plans" in data:  # the whole ``{"plans": [...]}`` document: the best plan
            plans = data["plans"]
            if not plans:
                raise SpecError("the plan document lists no plan (none fitted the devices)",
                                field="plans")
            return cls.from_mapping(plans[0])
        values: dict[str, Any] = {}
        names = {f.name for f in fields(cls)}
        for key, value in data.items():
            if key == "num_microbatches":
                key = "accumulation"
            if key in names:
                values[key] = value
        recompute, fraction = _parse_recompute(values.get("recompute", "none"),
                                               values.get("recompute_fraction"))
        values["recompute"], values["recompute_fraction"] = recompute, fraction
        for key in ("dp", "tp", "pp", "virtual_stages", "micro_batch", "accumulation",
                    "zero_stage"):
            if key in values and isinstance(values[key], float) and values[key].is_integer():
                values[key] = int(values[key])
        if "offload" in values:
            values["offload"] = bool(values["offload"])
        return cls(**values)

    @classmethod
    def load(cls, plan: Any) -> TrainingPlan:
        """A ``TrainingPlan`` from any accepted form (see ``apply_plan``)."""
        if isinstance(plan, TrainingPlan):
            return plan
        if isinstance(plan, ParallelConfig):
            return cls.from_config(plan)
        config = getattr(plan, "config", None)  # shoal.perf.parallel.Plan
        if isinstance(config, ParallelConfig):
            return cls.from_config(config)
        if isinstance(plan, Mapping):
            return cls.from_mapping(plan)
        if isinstance(plan, str | Path):
            path = Path(plan)
            try:
                data = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise SpecError(f"cannot read a plan from {path}: {exc}", field="plan") from None
            if not isinstance(data, Mapping):
                raise SpecError(f"{path} holds a JSON {type(data).__name__}, not a plan object",
                                field="plan")
            return cls.from_mapping(data)
        raise SpecError(f"expected a Plan, ParallelConfig, TrainingPlan, mapping or JSON path, "
                        f"got {type(plan).__name__}", field="plan")


_FRACTION = re.compile(r"^\s*(none|selective|full)\s*\(\s*([0-9.]+)\s*\)\s*$")


def _parse_recompute(value: Any, fraction: Any) -> tuple[str, float]:
    """``"full"``, ``"full(0.5)"``, ``0.5`` (a fraction of fully recomputed layers), ..."""
    if isinstance(value, bool):
        raise SpecError(f"expected none, selective, full or a fraction, got {value!r}",
                        field="recompute")
    if isinstance(value, int | float):
        if not 0.0 <= value <= 1.0:
            raise SpecError(f"a fraction of layers must be within [0, 1], got {value!r}",
                            field="recompute")
        return ("full", float(value)) if value > 0 else ("none", 1.0)
    text = str(value).strip().lower()
    match = _FRACTION.match(text)
    if match:
        return match.group(1), float(match.group(2))
    if text == "none":
        return "none", 1.0
    if fraction is None or (text != "none" and float(fraction) == 0.0):
        return text, 1.0
    return text, float(fraction)


# ---------------------------------------------------------------- recomputation

# Operators whose outputs selective activation checkpointing keeps (by aten name); everything
# else in a selectively checkpointed layer is recomputed in backward.
SELECTIVE_SAVE_OPS: tuple[str, ...] = (
    "mm", "addmm", "_scaled_mm", "convolution",  # matrix multiplications with weights
    "native_layer_norm", "_fused_rms_norm", "native_group_norm", "native_batch_norm",
    "gelu", "silu", "relu", "mish",  # activation functions: the next matmul's input
)
SelectivePolicy = Callable[..., Any]  # torch.utils.checkpoint's policy_fn


def _resolve_ops(names: Sequence[str]) -> set[Any]:
    ops = set()
    for name in names:
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None and hasattr(packet, "default"):
            ops.add(packet.default)
    return ops


def selective_policy(save: Sequence[str] = SELECTIVE_SAVE_OPS) -> SelectivePolicy:
    """A ``create_selective_checkpoint_contexts`` policy: keep the outputs of ``save``."""
    from torch.utils.checkpoint import CheckpointPolicy

    kept = _resolve_ops(save)

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        return CheckpointPolicy.MUST_SAVE if op in kept else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _checkpointed_forward(module: nn.Module, forward: Callable[..., Any],
                          policy: SelectivePolicy | None) -> Callable[..., Any]:
    options: dict[str, Any] = {}
    if policy is not None:
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        options["context_fn"] = partial(create_selective_checkpoint_contexts, policy)

    def run(*args: Any, **kwargs: Any) -> Any:
        if module.training and torch.is_grad_enabled():
            return checkpoint(forward, *args, use_reentrant=False, **options, **kwargs)
        return forward(*args, **kwargs)

    run.__wrapped__ = forward  # type: ignore[attr-defined]
    return run


def checkpoint_module(module: nn.Module, policy: SelectivePolicy | None = None) -> nn.Module:
    """Run ``module``'s forward under ``torch.utils.checkpoint`` while training (in place).

    With ``policy`` (see ``selective_policy``) the checkpoint is selective: operators the policy
    saves keep their outputs, the others are recomputed. The module keeps its class, parameters
    and state-dict keys, so FSDP can shard it afterwards: FSDP's hooks run around the
    checkpointed forward and gather the parameters again before the recomputation in backward.
    """
    if getattr(module, "_shoal_checkpointed", False):
        return module
    module.forward = _checkpointed_forward(  # type: ignore[method-assign]
        module, module.forward, policy)
    module._shoal_checkpointed = True  # type: ignore[assignment]
    return module


def _core_predicate(attention_core: CorePredicate | None) -> Callable[[nn.Module], bool]:
    if attention_core is None:
        return lambda m: isinstance(m, AttentionCore)
    if isinstance(attention_core, type | tuple):
        kinds = attention_core
        return lambda m: isinstance(m, kinds)
    return attention_core


def find_layers(model: nn.Module) -> list[nn.Module]:
    """The model's repeated layers: the children of its longest ``nn.ModuleList``."""
    best: nn.ModuleList | None = None
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and (best is None or len(module) > len(best)):
            best = module
    return list(best) if best is not None else []


SELECTIVE_MODES = ("auto", "core", "ops")


def apply_recompute(layers: Sequence[nn.Module], plan: TrainingPlan,
                    attention_core: CorePredicate | None = None, selective: str = "auto",
                    policy: SelectivePolicy | None = None) -> list[nn.Module]:
    """Checkpoint the first ``plan.recomputed_layers(len(layers))`` layers; returns them.

    ``full`` checkpoints each chosen layer. ``selective`` checkpoints the attention cores inside
    each chosen layer (``selective="core"``), or the whole layer selectively with ``policy``
    (default ``selective_policy()``) when ``selective="ops"``; ``"auto"`` takes the cores
    where a layer has one and the operator policy elsewhere. Megatron-LM also takes the first
    layers of a stage for a fraction.
    """
    if selective not in SELECTIVE_MODES:
        raise SpecError(f"must be one of {', '.join(SELECTIVE_MODES)}, got {selective!r}",
                        field="selective")
    count = plan.recomputed_layers(len(layers))
    if count == 0:
        return []
    if not layers:
        raise SpecError("the plan recomputes layers but the model has no nn.ModuleList of "
                        "layers; pass layers=[...] to apply_plan", field="recompute")
    chosen = list(layers[:count])
    if plan.recompute == "full":
        for layer in chosen:
            checkpoint_module(layer)
        return chosen
    is_core = _core_predicate(attention_core)
    for index, layer in enumerate(chosen):
        cores = [m for m in layer.modules() if m is not layer and is_core(m)]
        if cores and selective != "ops":
            for core in cores:
                checkpoint_module(core)
        elif selective == "core":
            raise SpecError(
                f"selective recompute checkpoints the attention core, but layer {index} "
                f"({type(layer).__name__}) has no attention-core submodule; pass "
                "attention_core=<its class or a predicate> to apply_plan, or "
                "selective='ops' (operator policy) or recompute='full'", field="recompute")
        else:
            checkpoint_module(layer, policy or selective_policy())
    return chosen


# ---------------------------------------------------------------- micro-batching


def batch_size(batch: Batch) -> int:
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0])
    if isinstance(batch, Mapping):
        return batch_size(next(iter(batch.values())))
    if isinstance(batch, Sequence) and batch:
        return batch_size(batch[0])
    raise TypeError(f"a batch is a tensor, a sequence or a mapping of tensors, got "
                    f"{type(batch).__name__}")


def slice_batch(batch: Batch, start: int, stop: int) -> Batch:
    """Rows ``start:stop`` of every tensor in ``batch`` (views, no copies)."""
    if isinstance(batch, torch.Tensor):
        return batch[start:stop]
    if isinstance(batch, Mapping):
        return {key: slice_batch(value, start, stop) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(slice_batch(value, start, stop) for value in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(slice_batch(value, start, stop) for value in batch)
    return batch


def split_microbatches(batch: Batch, micro_batch: int) -> list[Batch]:
    """Cut ``batch`` along dimension 0 into pieces of ``micro_batch`` rows."""
    size = batch_size(batch)
    if size % micro_batch:
        raise SpecError(f"a batch of {size} samples does not split into micro-batches of "
                        f"{micro_batch}", field="micro_batch")
    return [slice_batch(batch, i, i + micro_batch) for i in range(0, size, micro_batch)]


def _default_forward(model: nn.Module, batch: Batch) -> torch.Tensor:
    if isinstance(batch, torch.Tensor):
        return model(batch)
    if isinstance(batch, Mapping):
        return model(**batch)
    return model(*batch)


# ---------------------------------------------------------------- applying


@dataclass
class AppliedPlan:
    """A model with a plan applied, and the training step that follows the plan."""

    model: nn.Module  # the module to call: the FSDP-sharded model, a DDP wrapper or the model
    plan: TrainingPlan
    rank: int
    world_size: int
    sharding: str  # "none", "ddp", "ddp+zero1", "zero2", "fsdp-zero2" or "fsdp-zero3"
    layers: list[nn.Module]
    recomputed: list[nn.Module]
    sync_every_microbatch: bool
    notes: list[str] = field(default_factory=list)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    # ZeRO-2: the rank that owns each parameter's gradient and optimizer state (set by optimizer)
    owners: dict[nn.Parameter, int] = field(default_factory=dict, repr=False)

    @property
    def is_fsdp(self) -> bool:
        return self.sharding.startswith("fsdp")

    def optimizer(self, optimizer_class: type[torch.optim.Optimizer] = torch.optim.AdamW,
                  **kwargs: Any) -> torch.optim.Optimizer:
        """The plan's optimizer (build it once, after ``apply_plan``).

        ``ZeroRedundancyOptimizer`` under ZeRO-1 and ZeRO-2 (whose gradient hooks follow its
        assignment of parameters to ranks); under FSDP the optimizer over the sharded
        parameters; else ``optimizer_class`` over the model's parameters.
        """
        if self.sharding in ("ddp+zero1", "zero2"):
            from torch.distributed.optim import ZeroRedundancyOptimizer

            zero = ZeroRedundancyOptimizer(self.model.parameters(),
                                           optimizer_class=optimizer_class, **kwargs)
            if self.sharding == "zero2":
                if self.owners:
                    raise RuntimeError("a ZeRO-2 plan has one optimizer; it is already built")
                self.owners.update(zero._param_to_rank)
            return zero
        return optimizer_class(self.model.parameters(), **kwargs)

    def local_share(self, global_batch: Batch) -> Batch:
        """This rank's contiguous share of a global batch of ``plan.global_batch`` samples."""
        size = batch_size(global_batch)
        if size != self.plan.global_batch:
            raise SpecError(f"the plan's global batch is {self.plan.global_batch} (dp "
                            f"{self.plan.dp} x micro_batch {self.plan.micro_batch} x "
                            f"accumulation {self.plan.accumulation}), got {size} samples",
                            field="global_batch")
        share = self.plan.local_batch
        return slice_batch(global_batch, self.rank * share, (self.rank + 1) * share)

    def microbatches(self, local_batch: Batch) -> list[Batch]:
        size = batch_size(local_batch)
        if size != self.plan.local_batch:
            raise SpecError(f"each rank takes micro_batch {self.plan.micro_batch} x "
                            f"accumulation {self.plan.accumulation} = {self.plan.local_batch} "
                            f"samples per step, got {size}", field="micro_batch")
        return split_microbatches(local_batch, self.plan.micro_batch)

    def _sync(self, enabled: bool) -> Any:
        if self.is_fsdp:
            self.model.set_requires_gradient_sync(enabled)  # type: ignore[operator]
            return nullcontext()
        if not enabled and isinstance(self.model, nn.parallel.DistributedDataParallel):
            return self.model.no_sync()
        return nullcontext()

    def iter_microbatches(self, local_batch: Batch) -> Iterator[tuple[Batch, bool]]:
        """(micro-batch, is_last) pairs for a training loop written by hand.

        Run each micro-batch's forward and backward inside the loop body: the gradient
        synchronisation the plan asks for (DDP's ``no_sync`` before the last micro-batch,
        FSDP's ``set_requires_gradient_sync``) is in force there.
        """
        pieces = self.microbatches(local_batch)
        try:
            for index, piece in enumerate(pieces):
                last = index == len(pieces) - 1
                with self._sync(last or self.sync_every_microbatch):
                    yield piece, last
        finally:
            if self.is_fsdp:
                self.model.set_requires_gradient_sync(True)  # type: ignore[operator]

    def accumulate(self, local_batch: Batch, forward: ForwardFn | None = None,
                   average_loss: bool = True) -> torch.Tensor:
        """Forward and backward of every micro-batch; returns the mean loss (detached).

        Each micro-batch's loss is divided by the number of micro-batches, so with mean-reduced
        losses the accumulated gradient (averaged over ranks by DDP/FSDP/ZeRO-2) is the gradient
        of the mean loss over the global batch. With ``average_loss`` the returned loss is
        averaged over the data-parallel ranks too (one scalar all-reduce), so every rank
        reports the loss of the global batch.
        """
        forward = forward or _default_forward
        total = torch.zeros((), dtype=torch.float64)
        count = self.plan.accumulation
        for piece, _ in self.iter_microbatches(local_batch):
            loss = forward(self.model, piece)
            (loss / count).backward()
            total += loss.detach().to("cpu", torch.float64)
        mean = total / count
        if average_loss and self.world_size > 1:
            reduced = mean.to(self.device)
            dist.all_reduce(reduced)
            mean = reduced.cpu() / self.world_size
        return mean.float()

    def step(self, local_batch: Batch, optimizer: torch.optim.Optimizer,
             forward: ForwardFn | None = None, average_loss: bool = True) -> torch.Tensor:
        """One optimizer step on this rank's ``micro_batch * accumulation`` samples."""
        loss = self.accumulate(local_batch, forward, average_loss)
        optimizer.step()
        self.zero_grad(optimizer)
        return loss

    # ----- checkpoints that any plan and world size can resume from -----
    def _module(self) -> nn.Module:
        return (self.model.module if isinstance(self.model, nn.parallel.DistributedDataParallel)
                else self.model)

    def full_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        """The model's and ``optimizer``'s whole state, unsharded and keyed by parameter name,
        on rank 0 (None on the other ranks).

        Every rank must call it: sharded states are gathered. :meth:`load_full_state` restores
        it under any plan and number of ranks, so a job resized onto another plan (ZeRO-3 on
        four devices to plain data parallelism on two, say) resumes where it stopped.
        """
        if self.sharding in ("ddp+zero1", "zero2"):
            # ZeroRedundancyOptimizer: each rank holds its parameters' optimizer state.
            optimizer.consolidate_state_dict(to=0)  # type: ignore[attr-defined]
            if self.rank != 0:
                return None
            module = self._module()
            return _snapshot({"model": module.state_dict(),
                              "optimizer": _optimizer_state_by_name(optimizer.state_dict(),
                                                                    module)})
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        model_state, optimizer_state = get_state_dict(
            self.model, optimizer, options=StateDictOptions(full_state_dict=True,
                                                            cpu_offload=True))
        if self.rank != 0:
            return None
        return _snapshot({"model": model_state, "optimizer": optimizer_state})

    def load_full_state(self, optimizer: torch.optim.Optimizer,
                        state: dict[str, Any] | None) -> None:
        """Restore a :meth:`full_state` (needed on rank 0 only; every rank must call this)."""
        if self.rank == 0 and state is not None:
            # Optimizers adopt loaded tensors as their own buffers and the loaders rename keys
            # in place: load a copy, so the caller's state stays as it was. (The other ranks
            # receive their own copy from the broadcast.)
            state = _snapshot(state)
        if self.world_size > 1:
            shared = [state]
            dist.broadcast_object_list(shared, src=0)
            state = shared[0]
        if state is None:
            raise ValueError("load_full_state needs the state on rank 0")
        if self.sharding in ("ddp+zero1", "zero2"):
            module = self._module()
            module.load_state_dict(state["model"])
            optimizer.load_state_dict(_optimizer_state_by_index(state["optimizer"], module))
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(self.model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"],
                       options=StateDictOptions(full_state_dict=True))

    # ----- sharded checkpoints: every rank writes its own part -----
    def sharded_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The model's and ``optimizer``'s state as this rank holds it, keyed by parameter name
        (the layout ``torch.distributed.checkpoint`` saves and reshards): FSDP's shards,
        ZeRO-1/2's optimizer state of the parameters this rank owns, or the whole replica."""
        if self.sharding in ("ddp+zero1", "zero2"):
            module = self._module()
            local = optimizer.optim  # type: ignore[attr-defined]  # this rank's partition
            _init_optimizer_state(local)
            names = {param: name for name, param in module.named_parameters()}
            state = {names[param]: dict(local.state[param])
                     for group in local.param_groups for param in group["params"]}
            groups = [{**{k: v for k, v in group.items() if k != "params"},
                       "params": list(names.values())} for group in optimizer.param_groups]
            return {"model": module.state_dict(),
                    "optim": {"state": state, "param_groups": groups}}
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optimizer_state = get_state_dict(self.model, optimizer)
        return {"model": model_state, "optim": optimizer_state}

    def save_sharded(self, optimizer: torch.optim.Optimizer, path: Path | str) -> None:
        """Write the state into the folder ``path``, each rank its own part (every rank must
        call it; ``path`` must be one folder all ranks can write). :meth:`load_sharded`
        restores it under any plan and number of ranks, and no rank ever holds more than its
        own part."""
        import torch.distributed.checkpoint as dcp

        dcp.save(self.sharded_state(optimizer), checkpoint_id=str(path))

    def load_sharded(self, optimizer: torch.optim.Optimizer, path: Path | str) -> None:
        """Restore a :meth:`save_sharded` folder (every rank must call it)."""
        import torch.distributed.checkpoint as dcp

        state = self.sharded_state(optimizer)  # the layout to fill, under this plan
        dcp.load(state, checkpoint_id=str(path))
        if self.sharding in ("ddp+zero1", "zero2"):
            module = self._module()
            module.load_state_dict(state["model"])
            local = optimizer.optim  # type: ignore[attr-defined]
            names = {param: name for name, param in module.named_parameters()}
            for group in local.param_groups:
                for param in group["params"]:
                    local.state[param] = state["optim"]["state"][names[param]]
            for groups in (optimizer.param_groups, local.param_groups):
                for group, saved in zip(groups, state["optim"]["param_groups"], strict=False):
                    group.update({k: v for k, v in saved.items() if k != "params"})
            return
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(self.model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        """Clear gradients after a step: freed, except under DDP.

        DDP keeps its gradient buckets between steps; zeroing (rather than freeing) keeps each
        gradient a view of its bucket, so gradients exist once, also while micro-batches
        accumulate under ``no_sync``.
        """
        optimizer.zero_grad(set_to_none=not self.sharding.startswith("ddp"))


def _init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create an optimizer's lazily allocated state (a step with zero gradients and learning
    rate), so that a checkpoint can be loaded into it; torch's own helper for ``get_state_dict``,
    which ZeRO's per-rank optimizer does not go through."""
    from torch.distributed.checkpoint.state_dict import _init_optim_state

    _init_optim_state(optimizer)


def _snapshot(state: dict[str, Any]) -> dict[str, Any]:
    """Copies of the tensors in ``state``: unsharded state dicts share the live parameters'
    and optimizer buffers, which the next step would change under the caller."""
    return torch.utils._pytree.tree_map(
        lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x, state)


def _parameter_names(module: nn.Module) -> list[str]:
    """Names of ``module.parameters()`` in their order (tied parameters once)."""
    return [name for name, _ in module.named_parameters()]


def _optimizer_state_by_name(state: dict[str, Any], module: nn.Module) -> dict[str, Any]:
    """A ``torch.optim`` state dict keyed by parameter index (the optimizer was built over
    ``module.parameters()``) re-keyed by parameter name, as ``get_state_dict`` keys it."""
    names = _parameter_names(module)
    groups = [{**group, "params": [names[i] for i in group["params"]]}
              for group in state["param_groups"]]
    return {"state": {names[i]: value for i, value in state["state"].items()},
            "param_groups": groups}


def _optimizer_state_by_index(state: dict[str, Any], module: nn.Module) -> dict[str, Any]:
    index = {name: i for i, name in enumerate(_parameter_names(module))}
    groups = [{**group, "params": [index[name] for name in group["params"]]}
              for group in state["param_groups"]]
    return {"state": {index[name]: value for name, value in state["state"].items()},
            "param_groups": groups}


def _unsupported(plan: TrainingPlan) -> None:
    if plan.tp > 1:
        raise SpecError(
            f"tensor parallelism (tp={plan.tp}) is not provided by shoal.train; apply a plan "
            "with tp=1 (e.g. the best entry of `shoal plan --json` with tp == 1 and pp == 1) or "
            "run the model under Megatron-LM / torch.distributed.tensor.parallel yourself",
            field="tp")
    if plan.pp > 1 or plan.virtual_stages > 1:
        raise SpecError(
            f"pipeline parallelism (pp={plan.pp}, virtual_stages={plan.virtual_stages}) is not "
            "provided by shoal.train; apply a plan with pp=1 (e.g. the best entry of "
            "`shoal plan --json` with tp == 1 and pp == 1) or use torch.distributed.pipelining",
            field="pp")


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _device(model: nn.Module) -> torch.device:
    for param in model.parameters():
        return param.device
    return torch.device("cpu")


def _install_gradient_partitioning(model: nn.Module, owners: dict[nn.Parameter, int], rank: int,
                                   world: int) -> None:
    """ZeRO-2 gradients: reduce each new gradient to its owner, keep it only there."""

    def reduce_to_owner(param: nn.Parameter, grad: torch.Tensor) -> torch.Tensor:
        owner = owners.get(param)
        if owner is None:
            raise RuntimeError("ZeRO-2 partitions gradients by the optimizer's parameter "
                               "assignment: build the optimizer with AppliedPlan.optimizer() "
                               "before the first backward")
        averaged = grad / world  # a new tensor: reduce works in place
        dist.reduce(averaged, dst=owner)
        return averaged

    def drop_foreign(param: nn.Parameter) -> None:
        if owners.get(param) != rank:
            param.grad = None

    for param in model.parameters():
        if param.requires_grad:
            param.register_hook(partial(reduce_to_owner, param))
            param.register_post_accumulate_grad_hook(drop_foreign)


def apply_plan(model: nn.Module, plan: Any, *, layers: Sequence[nn.Module] | None = None,
               attention_core: CorePredicate | None = None, selective: str = "auto",
               selective_ops: SelectivePolicy | Sequence[str] | None = None,
               sync_every_microbatch: bool | None = None,
               fsdp_kwargs: Mapping[str, Any] | None = None,
               ddp_kwargs: Mapping[str, Any] | None = None) -> AppliedPlan:
    """Apply ``plan`` to ``model`` (in place) and return the handle that trains with it.

    ``plan``: a ``shoal.perf.parallel.Plan``, a ``ParallelConfig``, a ``TrainingPlan``, one plan
    as a mapping (``Plan.to_dict()``), a ``{"plans": [...]}`` document (its best plan) or the
    path of such a JSON file. ``layers``: the repeated layers that recomputation and FSDP units
    apply to (default: the children of the model's longest ``nn.ModuleList``).
    ``attention_core``: what selective recompute checkpoints (a module class, a tuple of them or
    a predicate; default ``shoal.train.plan.AttentionCore``); ``selective``: ``"auto"`` (the
    attention-core submodules where there are any, else the operator policy), ``"core"`` or
    ``"ops"``; ``selective_ops``: the operator policy (a ``create_selective_checkpoint_contexts``
    policy function or the aten operator names to keep; default ``SELECTIVE_SAVE_OPS``).
    A data-parallel plan needs ``torch.distributed`` initialised with ``dp`` processes; build
    the optimizer afterwards with ``AppliedPlan.optimizer``.
    """
    plan = TrainingPlan.load(plan)
    _unsupported(plan)
    rank, world = _world()
    if plan.dp != world:
        how = ("initialise torch.distributed with that many processes (e.g. torchrun "
               f"--nproc_per_node={plan.dp})" if world == 1 else
               f"re-plan for {world} devices")
        raise SpecError(f"the plan asks for dp={plan.dp} data-parallel ranks but "
                        f"{world} process{'es' if world > 1 else ''} run; {how}", field="dp")
    policy: SelectivePolicy | None
    if selective_ops is None or callable(selective_ops):
        policy = selective_ops
    else:
        policy = selective_policy(tuple(selective_ops))
    layer_list = list(layers) if layers is not None else find_layers(model)
    recomputed = apply_recompute(layer_list, plan, attention_core, selective, policy)
    notes: list[str] = []
    owners: dict[nn.Parameter, int] = {}
    device = _device(model)
    sharding = "none"
    wrapped: nn.Module = model
    offload_to_host = plan.offload and device.type != "cpu"
    if plan.offload and not offload_to_host:
        notes.append("offload: the model is on the CPU, so optimizer state and parameters "
                     "already live in host memory")
    if plan.dp > 1 and (plan.zero_stage == 3 or offload_to_host):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

        mesh = init_device_mesh(device.type, (plan.dp,))
        offload = CPUOffloadPolicy() if offload_to_host else OffloadPolicy()
        reshard = plan.zero_stage == 3
        if plan.zero_stage < 3:
            notes.append(f"zero_stage {plan.zero_stage} with offload is applied as FSDP with "
                         "parameters kept unsharded between forward and backward")
        extra = dict(fsdp_kwargs or {})
        if not layer_list:
            notes.append("no layer list found: the whole model is one FSDP unit")
        for layer in layer_list:
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard,
                        offload_policy=offload, **extra)
        fully_shard(model, mesh=mesh, reshard_after_forward=False, offload_policy=offload,
                    **extra)
        sharding = "fsdp-zero3" if reshard else "fsdp-zero2"
    elif plan.dp > 1 and plan.zero_stage == 2:
        _install_gradient_partitioning(model, owners, rank, world)
        sharding = "zero2"
    elif plan.dp > 1:
        # Gradients as views of the all-reduce buckets: no second copy of the gradients.
        options = {"gradient_as_bucket_view": True, **dict(ddp_kwargs or {})}
        wrapped = nn.parallel.DistributedDataParallel(model, **options)
        sharding = "ddp+zero1" if plan.zero_stage == 1 else "ddp"
    elif plan.zero_stage:
        notes.append("dp=1: ZeRO has nothing to shard across; running unsharded")
    if sync_every_microbatch is None:
        sync_every_microbatch = sharding.startswith("fsdp")
    if recomputed and not math.isclose(len(recomputed) / max(1, len(layer_list)),
                                       plan.recompute_fraction):
        notes.append(f"recompute {plan.recompute} on {len(recomputed)} of {len(layer_list)} "
                     f"layers (fraction {plan.recompute_fraction:g} rounded)")
    return AppliedPlan(model=wrapped, plan=plan, rank=rank, world_size=world, sharding=sharding,
                       layers=layer_list, recomputed=recomputed,
                       sync_every_microbatch=sync_every_microbatch, notes=notes, device=device,
                       owners=owners)


# ---------------------------------------------------------------- how a job asks for a plan

PLAN_VARIABLE = "SHOAL_PLAN"


def get_plan(default: Any = None, env: Mapping[str, str] | None = None) -> TrainingPlan | None:
    """The plan this process should train with, or None when neither source gives one.

    ``SHOAL_PLAN`` (set by the backend to the plan the scheduler chose for the job's
    allocation) wins: one plan as JSON (``Plan.to_dict()``, ``shoal plan --json`` row), a
    ``{"plans": [...]}`` document (its best plan) or the path of such a JSON file. Otherwise
    ``default`` (any form ``apply_plan`` accepts), for a script run outside shoal. A
    ``SHOAL_PLAN`` that cannot be read raises ``TrainEnvError`` naming the variable and field.
    """
    env = os.environ if env is None else env
    raw = (env.get(PLAN_VARIABLE) or "").strip()
    if not raw:
        return None if default is None else TrainingPlan.load(default)
    try:
        if not raw.startswith("{"):
            return TrainingPlan.load(Path(raw))
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise SpecError(f"not valid JSON: {exc}", field="plan") from None
        if not isinstance(data, Mapping):
            raise SpecError("expected a JSON object", field="plan")
        return TrainingPlan.from_mapping(data)
    except SpecError as exc:
        shown = raw if len(raw) <= 80 else raw[:77] + "..."
        raise TrainEnvError(f"{PLAN_VARIABLE}={shown!r}: {exc}") from exc
