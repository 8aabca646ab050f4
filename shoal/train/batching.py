"""How one global batch is split across replicas and accumulation micro-steps.

The data order depends only on the seed and the epoch, never on the world size: each epoch is
one global permutation, consumed in global batches; a global batch is cut into contiguous
per-rank shares, and each share into micro-batches of at most ``max_local_bsz`` samples. So a
run resized mid-epoch sees exactly the samples, and in the same global batches, as one that was
not. Every rank takes the same number of micro-steps, so DDP's gradient synchronisation lines up.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class MicroBatch:
    """One forward/backward pass on one rank.

    ``weight`` is this micro-batch's share of the global batch (samples / global batch), the
    factor its mean loss is scaled by so that the summed gradient is the mean over the global
    batch. A rank with no sample left in a short final batch gets one *padding* micro-batch that
    repeats a sample with weight 0: it only keeps the collective in step.
    """

    indices: tuple[int, ...]
    weight: float
    sync: bool
    padding: bool = False

    @property
    def size(self) -> int:
        return 0 if self.padding else len(self.indices)


@dataclass(frozen=True, slots=True)
class StepPlan:
    """Everything the trainer needs to know about the current optimizer step."""

    batch_size: int  # samples in this global batch (the last one of an epoch may be short)
    target_batch_size: int  # the global batch size in force
    init_batch_size: int
    shares: tuple[int, ...]  # samples per rank
    micro_sizes: tuple[int, ...]  # this rank's micro-batch sizes (0 for padding)
    micro_steps: int  # micro-steps per optimizer step, the same on every rank
    local_bsz: int  # largest micro-batch of any rank: the per-device batch size

    @property
    def accum_steps(self) -> int:
        """Extra accumulation micro-steps before the synchronising one (Pollux's ``s``)."""
        return self.micro_steps - 1


def epoch_permutation(num_samples: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The global sample order of one epoch."""
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    rng = np.random.default_rng([seed, epoch])
    return rng.permutation(num_samples).astype(np.int64)


def rank_shares(batch_size: int, world_size: int) -> list[int]:
    """Samples per rank: as even as possible, the first ranks take the remainder."""
    base, extra = divmod(batch_size, world_size)
    return [base + (1 if r < extra else 0) for r in range(world_size)]


def micro_steps_for(
    batch_size: int, world_size: int, max_local_bsz: int | None, min_micro_steps: int = 1
) -> int:
    """Micro-steps per optimizer step so that no micro-batch exceeds ``max_local_bsz``."""
    largest_share = -(-batch_size // world_size)
    steps = 1 if max_local_bsz is None else -(-largest_share // max_local_bsz)
    return max(1, min(max(steps, min_micro_steps), largest_share))


def _split_sizes(total: int, parts: int) -> list[int]:
    """Near-equal sizes, smaller first, zeros dropped (the last part is never empty)."""
    base, extra = divmod(total, parts)
    sizes = [base] * (parts - extra) + [base + 1] * extra
    return [s for s in sizes if s > 0]


def plan_step(
    global_indices: np.ndarray,
    rank: int,
    world_size: int,
    *,
    target_batch_size: int,
    init_batch_size: int,
    max_local_bsz: int | None,
    min_micro_steps: int = 1,
) -> tuple[StepPlan, list[MicroBatch]]:
    """This rank's micro-batches for one global batch."""
    batch = len(global_indices)
    if batch == 0:
        raise ValueError("a global batch needs at least one sample")
    shares = rank_shares(batch, world_size)
    steps = micro_steps_for(batch, world_size, max_local_bsz, min_micro_steps)
    start = sum(shares[:rank])
    local = [int(i) for i in global_indices[start : start + shares[rank]]]
    micro: list[MicroBatch] = []
    if not local:
        micro.append(MicroBatch((int(global_indices[0]),), 0.0, True, padding=True))
        sizes = [0]
    else:
        sizes = _split_sizes(len(local), steps)
        offset = 0
        for k, size in enumerate(sizes):
            chunk = tuple(local[offset : offset + size])
            offset += size
            micro.append(MicroBatch(chunk, size / batch, k == len(sizes) - 1))
    local_bsz = max(-(-share // steps) for share in shares)
    plan = StepPlan(
        batch_size=batch,
        target_batch_size=target_batch_size,
        init_batch_size=init_batch_size,
        shares=tuple(shares),
        micro_sizes=tuple(sizes),
        micro_steps=steps,
        local_bsz=local_bsz,
    )
    return plan, micro
