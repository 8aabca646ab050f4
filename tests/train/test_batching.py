from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.train.batching import epoch_permutation, plan_step, rank_shares


@settings(max_examples=200, deadline=None)
@given(
    batch=st.integers(1, 200),
    world=st.integers(1, 8),
    max_local=st.one_of(st.none(), st.integers(1, 64)),
)
def test_global_batch_is_split_exactly_once_whatever_the_world_size(
    batch: int, world: int, max_local: int | None
) -> None:
    indices = np.arange(1000, 1000 + batch)
    seen: list[int] = []
    weight = 0.0
    steps = set()
    for rank in range(world):
        plan, micro = plan_step(
            indices, rank, world, target_batch_size=batch, init_batch_size=batch,
            max_local_bsz=max_local,
        )
        steps.add(plan.micro_steps)
        assert [m.sync for m in micro] == [False] * (len(micro) - 1) + [True]
        assert len(micro) <= plan.micro_steps
        for m in micro:
            if not m.padding:
                seen.extend(m.indices)
                assert m.size >= 1
                if max_local is not None:
                    assert m.size <= max(max_local, 1)
            weight += m.weight
        assert plan.local_bsz >= max(m.size for m in micro)
    assert seen == list(indices)  # contiguous per-rank shares in rank order: nothing lost
    assert abs(weight - 1.0) < 1e-9
    assert len(steps) == 1  # every rank takes the same number of micro-steps


def test_rank_without_samples_gets_a_zero_weight_padding_batch() -> None:
    plan, micro = plan_step(
        np.array([5]), 1, 2, target_batch_size=12, init_batch_size=12, max_local_bsz=4
    )
    assert plan.shares == (1, 0)
    assert len(micro) == 1 and micro[0].padding and micro[0].weight == 0 and micro[0].size == 0


def test_rank_shares_are_balanced() -> None:
    assert rank_shares(10, 3) == [4, 3, 3]
    assert sum(rank_shares(7, 7)) == 7


def test_epoch_order_depends_on_seed_and_epoch_only() -> None:
    a = epoch_permutation(50, seed=3, epoch=1, shuffle=True)
    assert np.array_equal(a, epoch_permutation(50, seed=3, epoch=1, shuffle=True))
    assert not np.array_equal(a, epoch_permutation(50, seed=3, epoch=2, shuffle=True))
    assert sorted(a) == list(range(50))
    assert list(epoch_permutation(5, 0, 0, shuffle=False)) == [0, 1, 2, 3, 4]
