"""The job spec's batch bounds reach the loader: SHOAL_MAX_BATCH_SIZE and SHOAL_MAX_LOCAL_BSZ."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import shoal.train as st


@pytest.fixture(autouse=True)
def _fresh_context() -> Iterator[None]:
    yield
    st.shutdown()


def _loader(env: st.TrainEnv, batch_size: int = 8, **bounds: int) -> st.ElasticDataLoader:
    st.init(env=env, checkpoint_interval_s=None)
    data = TensorDataset(torch.randn(64, 3), torch.randn(64, 1))
    return st.ElasticDataLoader(data, batch_size, stats_split_every=0, **bounds)


def test_environment_parses_the_bounds() -> None:
    env = st.TrainEnv.from_environ({"SHOAL_MAX_BATCH_SIZE": "128", "SHOAL_MAX_LOCAL_BSZ": "16"})
    assert (env.max_batch_size, env.max_local_bsz) == (128, 16)
    with pytest.raises(st.TrainEnvError, match="SHOAL_MAX_BATCH_SIZE"):
        st.TrainEnv.from_environ({"SHOAL_MAX_BATCH_SIZE": "big"})


@pytest.mark.parametrize(
    ("script_max", "spec_max", "expected"),
    [
        (None, None, 8),  # neither states a bound: a fixed batch size
        (None, 64, 64),  # the spec alone lets the scheduler grow the batch
        (256, 64, 64),  # both are upper bounds: the smaller wins
        (32, 64, 32),
        (None, 4, 8),  # a spec bound below the script's batch size cannot shrink it
    ],
)
def test_max_batch_size_is_the_smaller_stated_bound(
    script_max: int | None, spec_max: int | None, expected: int
) -> None:
    bounds = {} if script_max is None else {"max_batch_size": script_max}
    loader = _loader(st.TrainEnv(max_batch_size=spec_max), **bounds)
    assert loader.max_batch_size == expected
    assert loader.set_batch_size(1000) == expected


def test_spec_local_bound_turns_a_large_share_into_accumulation() -> None:
    # Global batch 24 on one replica, at most 8 samples at once: 3 micro-steps of 8.
    loader = _loader(st.TrainEnv(batch_size=24, max_batch_size=32, max_local_bsz=8), 8,
                     max_local_bsz=16)
    assert loader.max_local_bsz == 8 and loader.batch_size == 24
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    trainer = st.ElasticTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1))
    sizes: list[int] = []
    for x, y in loader:
        sizes.append(len(x))
        trainer.backward(nn.functional.mse_loss(trainer.model(x), y))
        if trainer.step():
            break
    assert sizes == [8, 8, 8]
    assert loader.plan is not None
    assert (loader.plan.local_bsz, loader.plan.accum_steps) == (8, 2)
