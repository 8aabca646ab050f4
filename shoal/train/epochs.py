"""Restart-safe epochs: ``for epoch in shoal.train.epochs(N)`` resumes at the saved epoch."""

from __future__ import annotations

from collections.abc import Iterator

from shoal.train.context import current


def epochs(num_epochs: int) -> Iterator[int]:
    """Yield epoch numbers from the restored one up to ``num_epochs - 1``, then finish.

    An epoch interrupted by a checkpoint is yielded again after the restart; the data loader
    continues it from the saved position, so no sample is seen twice.
    """
    if num_epochs < 0:
        raise ValueError(f"num_epochs={num_epochs} must not be negative")
    ctx = current()
    while ctx.epochs.epoch < num_epochs:
        yield ctx.epochs.epoch
        if ctx.trainer is not None:
            ctx.trainer.epoch_done(ctx.epochs.epoch)
        ctx.epochs.epoch += 1
    ctx.finish()
