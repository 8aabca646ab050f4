"""A real job's model keeps what it measured on each device type apart (one fit per type)."""

from __future__ import annotations

import pytest

from shoal.backends.local.model import JobModel
from shoal.core.types import JobLimits
from shoal.perf import PerfParams
from shoal.perf.throughput import predict_grad_time, predict_step_time
from shoal.train.profile import StepProfile

LIMITS = JobLimits(init_batch_size=32, max_batch_size=512, min_local_bsz=8, max_local_bsz=128,
                   max_replicas=8)
FAST = PerfParams(0.02, 0.001, 0.05, 0.01, 0.01, 0.002, 1.5)


def _rows(perf: PerfParams, configs: list[tuple[int, int, int]],
          device_type: str | None) -> list[dict]:
    rows = []
    for nodes, replicas, bsz in configs:
        step = float(predict_step_time(perf, nodes, replicas, bsz, 0))
        compute = float(predict_grad_time(perf, bsz))
        row = {"num_nodes": nodes, "num_replicas": replicas, "local_bsz": bsz, "accum_steps": 0,
               "step_time": step, "sync_time": step - compute, "count": 20}
        if device_type:
            row["device_type"] = device_type
        rows.append(row)
    return rows


EXPLORED = [(1, 1, 16), (1, 1, 64), (1, 2, 32), (1, 4, 32), (2, 8, 32)]


def _model(device_type: str, rows: list[dict]) -> JobModel:
    model = JobModel(device_type, 10)
    model.update({"profile": rows, "grad_sqr": 1.0, "grad_var": 10.0, "init_batch_size": 32,
                  "max_batch_size": 512}, now=0.0)
    return model


def test_steps_measured_on_two_types_make_two_models() -> None:
    slow = PerfParams(0.5, 0.004, 0.05, 0.01, 0.01, 0.002, 1.5)  # a large cost per step
    model = _model("b", _rows(FAST, EXPLORED, "a") + _rows(slow, EXPLORED, "b"))
    hints = model.hints(LIMITS)
    assert set(hints.goodput) == {"a", "b"}
    assert hints.max_profiled_replicas == {"a": 8, "b": 8}
    one = {t: float(hints.goodput[t].throughput(1, 1, 64, 0)) for t in "ab"}
    assert one["a"] == pytest.approx(64 / float(predict_step_time(FAST, 1, 1, 64, 0)), rel=0.05)
    assert one["b"] == pytest.approx(64 / float(predict_step_time(slow, 1, 1, 64, 0)), rel=0.05)
    # the batch chosen for an allocation follows its type: where a step costs more, larger
    assert model.best_batch(LIMITS, 1, 1, "a") < model.best_batch(LIMITS, 1, 1, "b")


def test_a_type_run_on_one_replica_borrows_the_scaling_of_the_explored_type() -> None:
    slow = PerfParams(0.06, 0.004, 0.05, 0.01, 0.01, 0.002, 1.5)
    model = _model("a", _rows(FAST, EXPLORED, "a") + _rows(slow, [(1, 1, 32)], "b"))
    hints = model.hints(LIMITS)
    assert hints.max_profiled_replicas == {"a": 8, "b": 1}
    projected = hints.goodput["b"].perf
    # compute as measured on b, communication as measured on a
    assert float(predict_grad_time(projected, 32)) == pytest.approx(
        float(predict_grad_time(slow, 32)), rel=0.05)
    assert (projected.alpha_n, projected.beta_n, projected.alpha_r, projected.beta_r) == (
        pytest.approx(hints.goodput["a"].perf.alpha_n),
        pytest.approx(hints.goodput["a"].perf.beta_n),
        pytest.approx(hints.goodput["a"].perf.alpha_r),
        pytest.approx(hints.goodput["a"].perf.beta_r))


def test_rows_without_a_type_count_as_the_current_one() -> None:
    model = _model("cpu", _rows(FAST, EXPLORED, None))
    hints = model.hints(LIMITS)
    assert set(hints.goodput) == {"cpu"} and hints.max_profiled_replicas == {"cpu": 8}
    assert model.perf is not None and model.perf_params("gpu") is None


def test_a_checkpointed_profile_keeps_each_type_apart() -> None:
    on_a = StepProfile(warmup_steps=0, device_type="a")
    for _ in range(3):
        on_a.record((1, 1, 32, 0), 0.1, 0.0)
    on_b = StepProfile(warmup_steps=0, device_type="b")  # the job restarted on another type
    on_b.load_state_dict(on_a.state_dict())
    assert on_b.mean((1, 1, 32, 0)) is None
    on_b.record((1, 1, 32, 0), 0.3, 0.0)
    rows = {(r["device_type"], r["local_bsz"]): (r["step_time"], r["count"])
            for r in on_b.rows()}
    assert rows == {("a", 32): (pytest.approx(0.1), 3), ("b", 32): (pytest.approx(0.3), 1)}
    assert on_b.mean((1, 1, 32, 0)) == pytest.approx((0.3, 0.0))
    untyped = StepProfile(warmup_steps=0)
    untyped.record((1, 1, 32, 0), 0.2, 0.0)
    assert "device_type" not in untyped.rows()[0]


def test_a_type_never_run_on_is_predicted_from_the_ratio_of_peak_rates() -> None:
    model = _model("t4", _rows(FAST, EXPLORED, "t4"))
    model.type_peaks = {"t4": 65.0, "a100": 312.0}
    hints = model.hints(LIMITS)
    assert set(hints.goodput) == {"t4", "a100"}
    assert hints.max_profiled_replicas == {"t4": 8}  # nothing measured on the a100s
    t4, a100 = hints.goodput["t4"].perf, hints.goodput["a100"].perf
    assert float(predict_grad_time(a100, 64)) == pytest.approx(
        float(predict_grad_time(t4, 64)) * 65.0 / 312.0)
    assert (a100.alpha_n, a100.beta_n, a100.gamma) == (t4.alpha_n, t4.beta_n, t4.gamma)
    # without peak rates an unmeasured type has no model (policies fall back to a measured one)
    model.type_peaks = {}
    assert set(model.hints(LIMITS).goodput) == {"t4"}


def test_a_probes_steps_join_the_model_without_touching_progress() -> None:
    slow = PerfParams(0.06, 0.004, 0.05, 0.01, 0.01, 0.002, 1.5)
    model = _model("a", _rows(FAST, EXPLORED, "a"))
    model.update({"profile": _rows(FAST, EXPLORED, "a"), "epoch": 3, "steps": 40,
                  "samples_per_second": 50.0}, now=1.0)
    probe = _rows(slow, [(1, 1, 32)], "b") + _rows(slow, [(1, 1, 32)], None)
    model.update({"probe": True, "profile": probe, "epoch": 0, "steps": 10, "done": True,
                  "grad_sqr": 99.0, "grad_var": 1.0}, now=2.0)
    assert (model.epoch, model.steps, model.fraction) == (3, 40, 0.3)
    assert (model.grad.sqr, model.grad.var) == (1.0, 10.0) and model.reports == 2
    assert model.probe_rows == probe[:1]  # a row that names no type says nothing
    assert model.hints(LIMITS).max_profiled_replicas == {"a": 8, "b": 1}
    # The job's own reports keep replacing its rows; the probe's stay until the job runs on b.
    model.update({"profile": _rows(FAST, EXPLORED, "a"), "epoch": 4}, now=3.0)
    assert set(model.rows_by_type()) == {"a", "b"}
    own_b = _rows(slow, [(1, 2, 32)], "b")
    model.update({"profile": _rows(FAST, EXPLORED, "a") + own_b, "epoch": 5}, now=4.0)
    assert model.rows_by_type()["b"] == own_b
