"""An elastic data loader: global batches the scheduler may resize, restart-safe positions."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset, TensorDataset, default_collate

from shoal.train.batching import MicroBatch, StepPlan, epoch_permutation, plan_step
from shoal.train.context import current

log = logging.getLogger("shoal.train")


def _smallest(first: int | None, second: int | None, default: int | None) -> int | None:
    """The smaller of two optional upper bounds, ``default`` when neither is set."""
    bounds = [b for b in (first, second) if b is not None]
    return min(bounds) if bounds else default


class ElasticDataLoader:
    """Yields this rank's micro-batches of each global batch of the current epoch.

    ``batch_size`` is the user's (initial) global batch size; the scheduler may choose any
    global size in ``[batch_size, max_batch_size]`` through ``SHOAL_BATCH_SIZE`` at start or a
    report answer while running. ``max_batch_size`` and ``SHOAL_MAX_BATCH_SIZE`` (the job
    spec's bound) are both upper bounds, the smaller wins; with neither the batch size is fixed.
    ``max_local_bsz`` (or ``SHOAL_MAX_LOCAL_BSZ``, whichever is smaller) bounds one
    micro-batch; larger per-rank shares are split into accumulation micro-steps. With one
    replica, every ``stats_split_every``-th step is split into two micro-steps so the gradient
    noise scale can be measured (0 turns this off).
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        batch_size: int,
        *,
        max_batch_size: int | None = None,
        max_local_bsz: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        collate_fn: Callable[[list[Any]], Any] = default_collate,
        stats_split_every: int = 5,
    ) -> None:
        ctx = current()
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be at least 1")
        if max_batch_size is not None and max_batch_size < batch_size:
            raise ValueError(
                f"max_batch_size={max_batch_size} is below batch_size={batch_size}; "
                "raise max_batch_size or leave it unset for a fixed batch size"
            )
        max_batch_size = _smallest(max_batch_size, ctx.env.max_batch_size, batch_size)
        if max_batch_size < batch_size:
            log.warning(
                "shoal: SHOAL_MAX_BATCH_SIZE=%d is below the script's batch size %d; "
                "the batch size stays at %d", max_batch_size, batch_size, batch_size,
            )
            max_batch_size = batch_size
        if max_local_bsz is not None and max_local_bsz < 1:
            raise ValueError(f"max_local_bsz={max_local_bsz} must be at least 1")
        self.dataset = dataset
        self.num_samples = len(dataset)  # type: ignore[arg-type]
        if self.num_samples == 0:
            raise ValueError("the dataset is empty")
        self.init_batch_size = batch_size
        self.max_batch_size = max_batch_size
        self.max_local_bsz = _smallest(max_local_bsz, ctx.env.max_local_bsz, None)
        self.shuffle = shuffle
        self.seed = seed
        self.collate_fn = collate_fn
        self.stats_split_every = stats_split_every
        self._batch_size = batch_size
        self._epoch = 0
        self._position = 0
        self._steps = 0
        self.plan: StepPlan | None = None
        self.micro: MicroBatch | None = None
        ctx.checkpoint.register("loader", self)
        if ctx.env.batch_size is not None:
            self.set_batch_size(ctx.env.batch_size)
        ctx.loader = self

    # -- batch size -------------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        """The global batch size in force."""
        return self._batch_size

    def set_batch_size(self, batch_size: int) -> int:
        """Use ``batch_size`` (clamped to the user's bounds) from the next global batch on."""
        clamped = min(max(batch_size, self.init_batch_size), self.max_batch_size)
        if clamped != batch_size:
            log.warning(
                "shoal: batch size %d outside [%d, %d]; using %d",
                batch_size, self.init_batch_size, self.max_batch_size, clamped,
            )
        self._batch_size = clamped
        return clamped

    # -- position ---------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def position(self) -> int:
        """Samples of the current epoch consumed, counted in whole global batches."""
        return self._position

    @property
    def sample_indices(self) -> tuple[int, ...]:
        """Dataset indices of the micro-batch just yielded (empty for a padding micro-batch)."""
        if self.micro is None or self.micro.padding:
            return ()
        return self.micro.indices

    def __len__(self) -> int:
        """Optimizer steps in a full epoch at the current batch size."""
        return math.ceil(self.num_samples / self._batch_size)

    def __iter__(self) -> Iterator[Any]:
        ctx = current()
        epoch = ctx.epochs.epoch
        if epoch != self._epoch:
            self._epoch, self._position = epoch, 0
        order = epoch_permutation(self.num_samples, self.seed, epoch, self.shuffle)
        while self._position < self.num_samples:
            indices = order[self._position : self._position + self._batch_size]
            split = (
                ctx.world_size == 1
                and self.stats_split_every > 0
                and self._steps % self.stats_split_every == 0
            )
            plan, micro = plan_step(
                indices,
                ctx.rank,
                ctx.world_size,
                target_batch_size=self._batch_size,
                init_batch_size=self.init_batch_size,
                max_local_bsz=self.max_local_bsz,
                min_micro_steps=2 if split else 1,
            )
            self.plan = plan
            for k, mb in enumerate(micro):
                if mb.sync:
                    # Counted before the step completes: a checkpoint taken at this step's
                    # boundary must resume after this batch.
                    self._position += len(indices)
                    self._steps += 1
                self.micro = mb
                if ctx.trainer is not None:
                    ctx.trainer.begin_micro_batch(plan, mb, first=k == 0)
                yield self._fetch(mb.indices)

    def _fetch(self, indices: Sequence[int]) -> Any:
        if isinstance(self.dataset, TensorDataset):
            index = torch.as_tensor(indices, dtype=torch.long)
            return [t[index] for t in self.dataset.tensors]
        getitems = getattr(self.dataset, "__getitems__", None)
        items = getitems(list(indices)) if getitems else [self.dataset[i] for i in indices]
        return self.collate_fn(items)

    # -- checkpoint -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self._epoch,
            "position": self._position,
            "steps": self._steps,
            "batch_size": self._batch_size,
            "seed": self.seed,
            "num_samples": self.num_samples,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["num_samples"]) != self.num_samples:
            raise ValueError(
                f"the checkpoint was taken with {state['num_samples']} samples, the dataset now "
                f"has {self.num_samples}; use the same dataset or a fresh SHOAL_CHECKPOINT_DIR"
            )
        self._epoch = int(state["epoch"])
        self._position = int(state["position"])
        self._steps = int(state["steps"])
        self._batch_size = int(state["batch_size"])
        self.seed = int(state["seed"])
