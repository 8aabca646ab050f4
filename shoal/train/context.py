"""Process-wide state of a shoal training job: ``init()`` creates it once."""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from shoal.train.checkpoint import CheckpointStore
from shoal.train.env import TrainEnv
from shoal.train.report import Reporter
from shoal.train.signals import ResizeSignal, freeze_heap_at_exit
from shoal.train.standby import await_go

if TYPE_CHECKING:
    from shoal.train.data import ElasticDataLoader
    from shoal.train.planned import PlannedTrainer
    from shoal.train.trainer import ElasticTrainer

logger = logging.getLogger("shoal.train")

EXIT_CHECKPOINTED = 3
"""Exit code of every rank after a requested checkpoint: "restart me, I can resume"."""


@dataclass(slots=True)
class EpochCounter:
    epoch: int = 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])


@dataclass
class Context:
    env: TrainEnv
    checkpoint: CheckpointStore
    resize: ResizeSignal
    reporter: Reporter
    device: torch.device
    checkpoint_interval_s: float | None
    checkpoint_interval_steps: int | None
    report_interval_s: float
    epochs: EpochCounter = field(default_factory=EpochCounter)
    loader: ElasticDataLoader | None = None
    trainer: ElasticTrainer | PlannedTrainer | None = None
    finished: bool = False

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def restored(self) -> bool:
        return self.checkpoint.saved is not None

    def finish(self) -> None:
        """End of training: settle pending collectives, send the final report."""
        if self.finished:
            return
        self.finished = True
        if self.trainer is not None:
            self.trainer.finish()
        self.reporter.close()
        self.resize.restore()


_context: Context | None = None


def init(
    *,
    checkpoint_interval_s: float | None = 300.0,
    checkpoint_interval_steps: int | None = None,
    report_interval_s: float = 5.0,
    env: TrainEnv | None = None,
    timeout_s: float = 120.0,
) -> Context:
    """Read the environment, join the process group and load the checkpoint if there is one.

    ``SHOAL_CHECKPOINT_INTERVAL`` (seconds) in the environment overrides
    ``checkpoint_interval_s``. Calling ``init`` again returns the same context.
    """
    global _context
    if _context is not None:
        return _context
    env = env or TrainEnv.from_environ()
    if env.checkpoint_interval_s is not None:
        checkpoint_interval_s = env.checkpoint_interval_s
    # Before the rendezvous, which may wait for peers for a long time: a resize request that
    # arrives meanwhile is remembered and honoured at the first step boundary, not lost to
    # SIGTERM's default action.
    resize = ResizeSignal(env.checkpoint_dir)
    freeze_heap_at_exit()
    if env.standby_file is not None:
        await_go(env.standby_file, env.rank, resize, EXIT_CHECKPOINTED)
    use_cuda = torch.cuda.is_available()
    device = torch.device("cpu")
    if use_cuda:
        device = torch.device("cuda", env.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    if env.distributed and not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", env.master_addr)
        os.environ.setdefault("MASTER_PORT", str(env.master_port))
        try:
            dist.init_process_group(
                backend="nccl" if use_cuda else "gloo",
                init_method="env://",
                rank=env.rank,
                world_size=env.world_size,
                timeout=datetime.timedelta(seconds=timeout_s),
            )
        except BaseException:
            resize.restore()
            raise
    store = CheckpointStore(env.checkpoint_dir, env.rank)
    ctx = Context(
        env=env,
        checkpoint=store,
        resize=resize,
        reporter=Reporter(env.scheduler_url if env.rank == 0 else None, env.job),
        device=device,
        checkpoint_interval_s=checkpoint_interval_s,
        checkpoint_interval_steps=checkpoint_interval_steps,
        report_interval_s=report_interval_s,
    )
    store.register("epochs", ctx.epochs)
    if ctx.restored and env.rank == 0:
        logger.info("shoal: restored checkpoint %s (%s)", store.path, store.meta)
    _context = ctx
    return ctx


def current() -> Context:
    """The context made by ``init()``; a clear error when the script forgot to call it."""
    if _context is None:
        raise RuntimeError("call shoal.train.init() before using shoal.train objects")
    return _context


def log(message: str) -> None:
    """Print on rank 0 only (flushed, so a backend's log file shows progress live)."""
    if _context is None or _context.rank == 0:
        print(message, flush=True)


def shutdown() -> None:
    """Finish, leave the process group and forget the context (tests start fresh after it)."""
    global _context
    if _context is None:
        return
    _context.finish()
    if _context.env.distributed and dist.is_initialized():
        dist.destroy_process_group()
    _context = None
