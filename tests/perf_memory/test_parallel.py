"""Plan search: feasibility, ranking and the published Megatron 1T layout."""

from __future__ import annotations

import pytest

from shoal.perf.memory import plan_memory
from shoal.perf.models import GPTConfig, megatron_gpt
from shoal.perf.parallel import (
    GIB,
    MEGATRON_2021,
    SearchSpace,
    best_plan,
    known_device,
    search_plans,
)
from shoal.spec.errors import SpecError

A100 = known_device("a100-80g")


def test_megatron_1t_layout_is_the_smallest_model_parallel_size_that_fits() -> None:
    model = megatron_gpt(1008.0)
    result = search_plans(model, A100, 3072, 8, 3072, MEGATRON_2021)
    best = result.best
    assert best is not None
    assert (best.config.tp, best.config.pp, best.config.dp) == (8, 64, 6)  # published layout
    assert best.model_parallel_size == min(p.model_parallel_size for p in result.plans)
    capacity = 80 * GIB - MEGATRON_2021.reserved_bytes
    assert all(p.memory_bytes <= capacity for p in result.plans)
    # Half the pipeline depth does not fit, and the search says so.
    half = [r for r in result.rejected
            if r.config is not None and (r.config.tp, r.config.pp) == (8, 32)]
    assert half and all("GiB" in r.reason for r in half)
    assert plan_memory(model, half[0].config).peak > capacity


def test_ranking_is_by_step_time_and_throughput_matches() -> None:
    model = GPTConfig(layers=24, hidden=2048, heads=16, seq=2048, vocab=51200)
    result = search_plans(model, A100, 16, 8, 256)
    times = [p.step_time_s for p in result.plans]
    assert times == sorted(times)
    best = result.best
    assert best is not None and best.throughput == pytest.approx(256 / best.step_time_s)
    assert best.to_dict()["accumulation"] * best.config.micro_batch * best.config.dp == 256


def test_small_model_uses_plain_data_parallelism() -> None:
    model = GPTConfig(layers=12, hidden=768, heads=12, seq=1024, vocab=50257)
    plan = best_plan(model, A100, 8, 8, 64)
    assert plan is not None
    assert (plan.config.tp, plan.config.pp, plan.config.dp) == (1, 1, 8)
    assert plan.config.recompute == "none" and not plan.config.offload


def test_memory_bound_forces_sharding_or_model_parallelism() -> None:
    model = megatron_gpt(7.5)
    on_80 = best_plan(model, A100, 8, 8, 64, SearchSpace(zero_stages=(0,), offload=(False,)))
    assert on_80 is not None and on_80.model_parallel_size > 1  # 16 B/param > 80 GiB
    t4 = known_device("t4-16g")
    assert best_plan(megatron_gpt(1008.0), t4, 8, 4, 8) is None


def test_bad_inputs_name_the_field() -> None:
    with pytest.raises(SpecError, match="num_devices"):
        best_plan(megatron_gpt(1.7), A100, 0, 8, 8)
    with pytest.raises(SpecError, match="a100-80g"):
        known_device("a100-81g")
