"""Measured memory and FLOPs of one training step of any ``torch.nn.Module``, without allocating it.

The module is built and run under ``FakeTensorMode`` (tensors carry shapes, no storage), and the
second training step (Adam allocates its state lazily in the first) is tracked with
``torch.distributed._tools.mem_tracker.MemTracker`` for peak memory by category and with
``FlopCounterMode`` for FLOPs. With ``fake=False`` the same runs on real CPU tensors, which is
how the formulas are checked against a real small model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker
from torch.utils.flop_counter import FlopCounterMode

ModuleFactory = Callable[[], nn.Module]
InputFactory = Callable[[int], Sequence[torch.Tensor]]


@dataclass(frozen=True, slots=True)
class MeasuredStep:
    """Bytes on the device during the tracked (second) training step."""

    num_parameters: int
    micro_batch: int
    params: int
    buffers: int
    optimizer: int
    activations: int  # saved for backward at the end of the forward pass
    peak: int  # everything live at the step's peak
    peak_by_category: dict[str, int]
    flops: int  # forward + backward (+ recomputation) of one micro-batch; 0 if not counted

    @property
    def activations_per_sample(self) -> float:
        return self.activations / self.micro_batch

    @property
    def flops_per_sample(self) -> float:
        return self.flops / self.micro_batch


def _snapshot(tracker: MemTracker, kind: str) -> dict[str, int]:
    per_device = tracker.get_tracker_snapshot(kind)
    totals: dict[str, int] = {}
    for snapshot in per_device.values():
        for category, nbytes in snapshot.items():
            name = getattr(category, "value", str(category))
            totals[name] = totals.get(name, 0) + int(nbytes)
    return totals


def _loss(output: object) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output if output.dim() == 0 else output.float().sum()
    if isinstance(output, Sequence) and output and isinstance(output[0], torch.Tensor):
        return _loss(output[0])
    raise TypeError(f"the module returned {type(output).__name__}; return a tensor (the loss)")


def measure_training_step(build: ModuleFactory, make_inputs: InputFactory, micro_batch: int,
                          fake: bool = True,
                          optimizer: Callable[..., torch.optim.Optimizer] = torch.optim.Adam,
                          count_flops: bool = True) -> MeasuredStep:
    """Run two training steps of ``build()`` on ``make_inputs(micro_batch)``; track the second."""
    mode = FakeTensorMode() if fake else nullcontext()
    with mode:
        model = build()
        model.train()
        opt = optimizer(model.parameters())
        inputs = tuple(make_inputs(micro_batch))
        # The first step counts FLOPs and lets the optimizer allocate its lazy state. FLOPs are
        # not counted in the tracked step: FlopCounterMode in backward changes what activation
        # checkpointing keeps alive, so MemTracker would see more than a plain step holds.
        flop_counter = FlopCounterMode(display=False)
        if count_flops:
            with flop_counter:
                _loss(model(*inputs)).backward()
        else:  # zero gradients make the optimizer allocate its state just as well
            for param in model.parameters():
                param.grad = torch.zeros_like(param)
        opt.step()
        opt.zero_grad(set_to_none=True)
        tracker = MemTracker()
        tracker.track_external(model, opt)
        with tracker:
            loss = _loss(model(*inputs))
            after_forward = _snapshot(tracker, "current")
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        peak = _snapshot(tracker, "peak")
    return MeasuredStep(
        num_parameters=sum(p.numel() for p in model.parameters()),
        micro_batch=micro_batch,
        params=peak.get("Parameter", 0),
        buffers=peak.get("Buffer", 0),
        optimizer=peak.get("Optstate", 0),
        activations=after_forward.get("Activation", 0),
        peak=peak.get("Total", 0),
        peak_by_category=peak,
        flops=int(flop_counter.get_total_flops()),
    )
