"""The library in this process, one rank: restore, batch-size changes, LR scaling, reports."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import shoal.train as st
from tests.train.test_env_and_report import Scheduler


@pytest.fixture
def scheduler() -> Iterator[Scheduler]:
    server = Scheduler({"batch_size": 24})
    yield server
    server.close()


def _setup(env: st.TrainEnv, **loader_args: int) -> tuple[st.ElasticDataLoader, st.ElasticTrainer]:
    st.init(env=env, checkpoint_interval_s=None, report_interval_s=0.0)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(40, 4, generator=g), torch.randn(40, 1, generator=g))
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = st.ElasticDataLoader(data, 8, max_batch_size=32, seed=1, **loader_args)
    trainer = st.ElasticTrainer(model, optimizer, lr_scaling="linear")
    return loader, trainer


def _train_steps(loader: st.ElasticDataLoader, trainer: st.ElasticTrainer, steps: int) -> None:
    for x, y in loader:
        trainer.backward(nn.functional.mse_loss(trainer.model(x), y))
        if trainer.step() and trainer.steps >= steps:
            return


def test_restore_with_new_batch_size_scales_lr_and_follows_scheduler(
    tmp_path: Path, scheduler: Scheduler
) -> None:
    env = st.TrainEnv(checkpoint_dir=tmp_path, job="lin")
    try:
        loader, trainer = _setup(env, stats_split_every=1)
        _train_steps(loader, trainer, 2)
        assert loader.position == 16
        assert trainer.grad_stats is not None  # one replica: measured from 2 micro-steps
        trainer.save_checkpoint()
        weight = trainer.module.weight.detach().clone()
    finally:
        st.shutdown()

    env = st.TrainEnv(checkpoint_dir=tmp_path, job="lin", batch_size=16,
                      scheduler_url=scheduler.url)
    try:
        loader, trainer = _setup(env)
        assert torch.equal(trainer.module.weight, weight)  # model restored
        assert (loader.position, loader.batch_size, trainer.steps) == (16, 16, 2)
        _train_steps(loader, trainer, 3)
        assert loader.position == 32
        assert trainer.last_lr_factor == 2.0  # linear rule: batch 16 / initial 8
        assert trainer.optimizer.param_groups[0]["lr"] == 0.1  # the user's LR is untouched
        st.current().reporter.close()  # flush the report, collect the answer
        assert scheduler.received, "no report reached the scheduler"
        path, report = scheduler.received[-1]
        assert path == "/api/jobs/lin/report"
        assert report["batch_size"] == 16 and report["init_batch_size"] == 8
        assert report["samples"] == 32 and report["epoch_position"] == 32
        assert isinstance(report["profile"], list) and report["grad_sqr"] is not None
        assert st.current().reporter.requested_batch_size == 24
        _train_steps(loader, trainer, 4)  # the last 8 samples of the epoch
        assert loader.batch_size == 24  # the scheduler's batch size, applied at the boundary
    finally:
        st.shutdown()


def test_batch_size_outside_user_bounds_is_clamped(tmp_path: Path) -> None:
    try:
        loader, _ = _setup(st.TrainEnv(batch_size=1000))
        assert loader.batch_size == 32
    finally:
        st.shutdown()


def test_using_the_library_before_init_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="init"):
        st.ElasticDataLoader(TensorDataset(torch.zeros(4, 1)), 2)
