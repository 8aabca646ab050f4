"""The memory model reproduces published formulas and tables exactly."""

from __future__ import annotations

import pytest

from shoal.perf.memory import (
    FP32_ADAM,
    MIXED_ADAM,
    MIXED_ADAM_FP32_GRADS,
    ParallelConfig,
    in_flight_microbatches,
    layer_activation_bytes,
    model_state_bytes,
    plan_memory,
)
from shoal.perf.models import MEGATRON_GPT_TABLE, GPTConfig, megatron_gpt, parse_gpt_spec
from shoal.spec.errors import SpecError

# ZeRO (Rajbhandari et al. 2020), Table 1: model-state GB per device, K = 12, for Pos, Pos+g,
# Pos+g+p at data-parallel degree N_d, for 7.5B, 128B and 1T parameters.
ZERO_TABLE_1 = {
    7.5e9: {1: (120, 120, 120), 4: (52.5, 41.3, 30), 16: (35.6, 21.6, 7.5),
            64: (31.4, 16.6, 1.88), 256: (30.4, 15.4, 0.47), 1024: (30.1, 15.1, 0.12)},
    128e9: {1: (2048, 2048, 2048), 4: (896, 704, 512), 16: (608, 368, 128),
            64: (536, 284, 32), 256: (518, 263, 8), 1024: (513, 257, 2)},
    1e12: {1: (16000, 16000, 16000), 4: (7000, 5500, 4000), 16: (4750, 2875, 1000),
           64: (4187, 2218, 250), 256: (4046, 2054, 62.5), 1024: (4011, 2013, 15.6)},
}


def _matches_printed(value: float, printed: float) -> bool:
    """True when ``value`` printed to ``printed``'s digits (rounded or truncated) gives it."""
    text = repr(float(printed))
    decimals = len(text.split(".")[1].rstrip("0")) if "." in text else 0
    unit = 10.0**-decimals
    return printed - unit / 2 - 1e-9 <= value < printed + unit


@pytest.mark.parametrize("params", sorted(ZERO_TABLE_1))
def test_zero_table_1(params: float) -> None:
    for dp, row in ZERO_TABLE_1[params].items():
        for stage, printed in zip((1, 2, 3), row, strict=True):
            gb = model_state_bytes(params, stage, dp, MIXED_ADAM).total / 1e9
            assert _matches_printed(gb, printed), (params, dp, stage, gb, printed)


def test_zero_stage_formulas_and_offload() -> None:
    p, n = 1000.0, 8
    assert model_state_bytes(p, 0, n).total == 16 * p
    assert model_state_bytes(p, 1, n).total == 4 * p + 12 * p / n
    assert model_state_bytes(p, 2, n).total == 2 * p + 14 * p / n
    assert model_state_bytes(p, 3, n).total == 16 * p / n
    assert model_state_bytes(p, 0, 1, MIXED_ADAM_FP32_GRADS).total == 18 * p
    offloaded = model_state_bytes(p, 2, n, offload_optimizer=True)
    assert offloaded.total == 2 * p + 2 * p / n
    assert offloaded.host_optimizer == 12 * p / n
    with pytest.raises(ValueError, match="zero_stage"):
        model_state_bytes(p, 4, n)


@pytest.mark.parametrize("row", MEGATRON_GPT_TABLE, ids=lambda row: f"{row[0]}B")
def test_megatron_parameter_counts(row: tuple) -> None:
    published, heads, hidden, layers = row[:4]
    model = megatron_gpt(published)
    L, h, V, s = layers, hidden, 51200, 2048
    formula = 12 * L * h**2 * (1 + 13 / (12 * h) + (V + s) / (12 * L * h))
    assert model.num_parameters() == pytest.approx(formula, rel=1e-12)
    assert round(model.num_parameters() / 1e9, 1) == published
    assert model.heads == heads


def test_full_recompute_flops_match_megatron_formula() -> None:
    model = megatron_gpt(145.6)
    B, s, L, h, V = 4, model.seq, model.layers, model.hidden, model.vocab
    published = 96 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))
    assert model.training_flops(B, recomputed_layer_fraction=1.0) == pytest.approx(published)


KORTHIKANTI_CASES = [(2048, 1, 12288, 96, 8), (2048, 4, 4096, 32, 2), (512, 3, 1024, 16, 4)]


@pytest.mark.parametrize(("s", "b", "h", "a", "t"), KORTHIKANTI_CASES)
def test_korthikanti_table_2(s: int, b: int, h: int, a: int, t: int) -> None:
    sbh = s * b * h

    def act(tp: int = 1, sp: bool = False, recompute: str = "none") -> float:
        return layer_activation_bytes(s, b, h, a, tp, sp, recompute)

    assert act() == pytest.approx(sbh * (34 + 5 * a * s / h))
    assert act(t) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert act(t, True) == pytest.approx(sbh / t * (34 + 5 * a * s / h))
    assert act(t, False, "selective") == pytest.approx(sbh * (10 + 24 / t))
    assert act(t, True, "selective") == pytest.approx(34 * sbh / t)
    assert act(t, False, "full") == pytest.approx(2 * sbh)
    assert act(t, True, "full") == pytest.approx(2 * sbh / t)
    # Flash attention keeps no as^2 matrices, only float32 softmax statistics.
    flash = layer_activation_bytes(s, b, h, a, t, True, "none", flash_attention=True)
    assert flash == pytest.approx(34 * sbh / t + 4 * a * s * b / t)
    # Generalised element size: fp32 activations with 1-byte masks give 66 sbh + 9 as^2 b.
    fp32 = layer_activation_bytes(s, b, h, a, activation_bytes=4)
    assert fp32 == pytest.approx(66 * sbh + 9 * a * s * s * b)


def test_pipeline_in_flight_microbatches() -> None:
    assert in_flight_microbatches(1, 64) == 1
    assert in_flight_microbatches(8, 64) == 8
    assert in_flight_microbatches(8, 3) == 3  # fewer micro-batches than stages
    assert in_flight_microbatches(8, 64, virtual_stages=4) == pytest.approx(8 * (1 + 7 / 32))


def test_first_stage_holds_all_layers_worth_of_activations() -> None:
    """Under 1F1B the first stage stores p micro-batches of L/p layers: L layers in total."""
    model = GPTConfig(layers=32, hidden=4096, heads=32, seq=2048, vocab=51200)
    cfg = ParallelConfig(tp=8, pp=4, num_microbatches=16, recompute="selective",
                         sequence_parallel=True)
    est = plan_memory(model, cfg)
    sbh = model.seq * model.hidden
    layers = model.layers * 34 * sbh / 8
    # The rest are the embedding dropout masks of the 4 in-flight micro-batches and norm stats.
    extras = 4 * sbh / 8 + 4 * (model.layers / 4) * 16 * model.seq / 8
    assert est.activations == pytest.approx(layers + extras)


def test_plan_memory_adds_embedding_logits_and_transients() -> None:
    model = GPTConfig(layers=2, hidden=64, heads=4, seq=32, vocab=1000)
    cfg = ParallelConfig(micro_batch=2, precision=FP32_ADAM)
    est = plan_memory(model, cfg)
    assert est.params == 4 * model.exact_parameters()
    assert est.optimizer == 8 * model.exact_parameters()
    logits = 4 * 32 * 2 * 1000
    assert est.activations > logits
    assert est.backward_transient >= 2 * logits
    assert est.peak == pytest.approx(
        est.params + est.optimizer + est.activations + est.backward_transient)


def test_fsdp_buffers_and_offload_change_the_peak() -> None:
    model = megatron_gpt(7.5)
    base = ParallelConfig(dp=8, micro_batch=1, recompute="full")
    zero3 = plan_memory(model, base.with_(zero_stage=3))
    assert zero3.fsdp_buffers > 0
    assert zero3.params == pytest.approx(2 * model.exact_parameters() / 8)
    zero2 = plan_memory(model, base.with_(zero_stage=2))
    offloaded = plan_memory(model, base.with_(zero_stage=2, offload=True))
    assert offloaded.optimizer == 0 and offloaded.host_bytes == pytest.approx(zero2.optimizer)
    assert offloaded.peak < zero2.peak


def test_parse_gpt_spec_errors_name_the_field() -> None:
    model = parse_gpt_spec("gpt:layers=32,hidden=4096,heads=32,seq=2048,vocab=51200")
    assert model.num_parameters() == 12 * 32 * 4096**2 + 13 * 32 * 4096 + (51200 + 2048) * 4096
    with pytest.raises(SpecError, match="heads"):
        parse_gpt_spec("gpt:layers=2,hidden=100,heads=3,seq=8,vocab=10")
    with pytest.raises(SpecError, match="missing vocab"):
        parse_gpt_spec("gpt:layers=2,hidden=8,heads=2,seq=8")
    with pytest.raises(SpecError, match=r"model\.layers"):
        parse_gpt_spec("gpt:layers=x,hidden=8,heads=2,seq=8,vocab=4")
