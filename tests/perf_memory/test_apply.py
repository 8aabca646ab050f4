"""Plans applied to a real PyTorch GPT on CPU, measured with MemTracker against the memory model.

Single-process checks run here; the two-process FSDP / ZeRO-2 runs start ``apply_worker.py`` as
two ranks over gloo on the loopback interface.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
import time
from pathlib import Path

import pytest
import torch

from shoal.perf.measure import MeasuredStep, measure_training_step
from shoal.perf.memory import (
    FP32_ADAM,
    MemoryEstimate,
    ParallelConfig,
    RecomputePolicy,
    plan_memory,
)
from shoal.perf.models import GPTConfig
from shoal.perf.parallel import SearchSpace, search_plans
from shoal.spec.cluster import DeviceType
from shoal.spec.errors import SpecError
from shoal.train import TrainEnvError, apply_plan, get_plan
from shoal.train.apply import TrainingPlan
from shoal.train.plan import ReferenceGPT, random_batch
from tests.perf_memory import apply_worker

REPO = Path(__file__).resolve().parents[2]
# Small enough for a few seconds per measured step, large enough that every term matters:
# with as/h = 4 the attention scores are about a third of each layer's saved activations.
MODEL = GPTConfig(layers=4, hidden=64, heads=2, seq=128, vocab=256)
BATCH = 4
TINY = GPTConfig(layers=2, hidden=32, heads=2, seq=16, vocab=64)


def _measure(plan: TrainingPlan, **options: object) -> tuple[MeasuredStep, MemoryEstimate]:
    def build() -> torch.nn.Module:
        return apply_plan(ReferenceGPT(MODEL, dropout=0.1), plan, **options).model

    measured = measure_training_step(build, lambda b: random_batch(MODEL, b), plan.micro_batch,
                                     fake=False, count_flops=False)
    return measured, plan_memory(MODEL, plan.to_parallel_config(FP32_ADAM))


@pytest.fixture(scope="module")
def recompute_runs() -> dict[str, tuple[MeasuredStep, MemoryEstimate]]:
    return {name: _measure(TrainingPlan.from_mapping({"recompute": name, "micro_batch": BATCH}))
            for name in ("none", "selective", "full", "full(0.5)")}


# ---------------------------------------------------------------- recomputation


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_applied_recompute_matches_the_memory_model(recompute_runs: dict,
                                                    recompute: str) -> None:
    measured, predicted = recompute_runs[recompute]
    assert measured.activations == pytest.approx(predicted.activations, rel=0.05)
    # The causal-mask buffer is the module's own, not the model's: count it as measured.
    assert measured.peak - measured.buffers == pytest.approx(predicted.peak, rel=0.05)


def test_recompute_drop_matches_the_prediction(recompute_runs: dict) -> None:
    base_measured, base_predicted = recompute_runs["none"]
    for name in ("selective", "full"):
        measured, predicted = recompute_runs[name]
        drop = base_measured.activations - measured.activations
        assert drop > 0.3 * base_measured.activations
        assert base_predicted.activations - predicted.activations == pytest.approx(drop, rel=0.05)
        peak_drop = base_measured.peak - measured.peak
        assert base_predicted.peak - predicted.peak == pytest.approx(peak_drop, rel=0.05)


def test_fraction_of_layers_recomputed(recompute_runs: dict) -> None:
    measured, predicted = recompute_runs["full(0.5)"]
    none, full = recompute_runs["none"][0], recompute_runs["full"][0]
    assert full.activations < measured.activations < none.activations
    assert measured.activations == pytest.approx(predicted.activations, rel=0.05)
    # The first layers are the recomputed ones; their backward runs last, after the other
    # layers' activations are freed: the model walks backward layer by layer, so the rebuilt
    # layer does not come on top of every saved activation.
    assert measured.peak - measured.buffers == pytest.approx(predicted.peak, rel=0.05)


def test_planner_turns_recompute_on_and_the_drop_is_measured() -> None:
    def peak(recompute: RecomputePolicy) -> float:
        config = ParallelConfig(micro_batch=1, recompute=recompute, precision=FP32_ADAM)
        return plan_memory(MODEL, config).peak

    # A device on which not even one sample fits without recomputation.
    device = DeviceType(name="cpu-test", memory_gb=(peak("none") + peak("selective")) / 2 / 2**30)
    space = SearchSpace(precision=FP32_ADAM, reserved_bytes=0, zero_stages=(0,),
                        offload=(False,))
    best = search_plans(MODEL, device, num_devices=1, devices_per_node=1, global_batch=BATCH,
                        space=space).best
    assert best is not None and best.config.recompute != "none"
    capacity = device.memory_gb * 2**30
    off = best.config.with_(recompute="none")
    measured_on, _ = _measure(TrainingPlan.load(best))
    measured_off, predicted_off = _measure(TrainingPlan.from_config(off))
    assert measured_on.peak - measured_on.buffers <= capacity < measured_off.peak
    assert predicted_off.activations - best.memory.activations == pytest.approx(
        measured_off.activations - measured_on.activations, rel=0.05)


def test_selective_with_the_operator_policy() -> None:
    plan = TrainingPlan(micro_batch=BATCH, recompute="selective")
    measured, predicted = _measure(plan, selective="ops")
    # Keeps matmul, norm and GELU outputs instead of the exact tensors autograd saves.
    assert measured.activations == pytest.approx(predicted.activations, rel=0.05)


def _gradients(plan: TrainingPlan, batch: tuple[torch.Tensor, ...], dropout: float,
               **options: object) -> tuple[float, list[torch.Tensor]]:
    torch.manual_seed(0)
    applied = apply_plan(ReferenceGPT(TINY, dropout=dropout), plan, **options)
    torch.manual_seed(1)  # the same dropout masks in every run
    loss = applied.accumulate(batch)
    return float(loss), [p.grad.clone() for p in applied.model.parameters()]


@pytest.mark.parametrize("recompute,selective", [
    ("selective", "core"), ("selective", "ops"), ("full", "auto"), ("full(0.5)", "auto"),
])
def test_recomputation_leaves_the_gradients_unchanged(recompute: str, selective: str) -> None:
    batch = random_batch(TINY, 4, torch.Generator().manual_seed(3))
    loss, reference = _gradients(TrainingPlan(micro_batch=4), batch, dropout=0.1)
    plan = TrainingPlan.from_mapping({"micro_batch": 4, "recompute": recompute})
    loss_r, grads = _gradients(plan, batch, dropout=0.1, selective=selective)
    assert loss_r == loss
    for got, want in zip(grads, reference, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- micro-batching


def test_accumulated_microbatches_give_the_full_batch_gradient() -> None:
    batch = random_batch(TINY, 8, torch.Generator().manual_seed(4))
    loss, full = _gradients(TrainingPlan(micro_batch=8), batch, dropout=0.0)
    loss_acc, accumulated = _gradients(TrainingPlan(micro_batch=2, accumulation=4), batch,
                                       dropout=0.0)
    assert loss_acc == pytest.approx(loss, rel=1e-6)
    for got, want in zip(accumulated, full, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_step_takes_only_the_planned_batch() -> None:
    applied = apply_plan(ReferenceGPT(TINY, dropout=0.0), {"micro_batch": 2, "accumulation": 3})
    optimizer = applied.optimizer(torch.optim.SGD, lr=0.1)
    with pytest.raises(SpecError) as error:
        applied.step(random_batch(TINY, 4), optimizer)
    assert error.value.field == "micro_batch"
    before = [p.detach().clone() for p in applied.model.parameters()]
    applied.step(random_batch(TINY, 6), optimizer)
    assert any(not torch.equal(a, b) for a, b in zip(before, applied.model.parameters(),
                                                          strict=True))
    assert all(p.grad is None for p in applied.model.parameters())


# ---------------------------------------------------------------- plans and how a job asks


def test_plan_forms() -> None:
    space = SearchSpace(precision=FP32_ADAM, reserved_bytes=0)
    device = DeviceType(name="big", memory_gb=80)
    best = search_plans(MODEL, device, 1, 1, 8, space).best
    assert best is not None
    for form in (best, best.config, best.to_dict(), {"plans": [best.to_dict()]}):
        plan = TrainingPlan.load(form)
        assert (plan.micro_batch, plan.accumulation) == (best.config.micro_batch,
                                                         best.config.num_microbatches)
        assert plan.recompute == best.config.recompute
    assert TrainingPlan.from_mapping({"recompute": "full(0.25)"}).recomputed_layers(8) == 2
    assert TrainingPlan.from_mapping({"recompute": 0.5}).recompute_fraction == 0.5
    assert TrainingPlan.from_mapping({"recompute": "full", "recompute_fraction": 0.75}) \
        .recomputed_layers(4) == 3
    with pytest.raises(SpecError) as error:
        TrainingPlan.load({"plans": []})
    assert error.value.field == "plans"


@pytest.mark.parametrize("changes,field", [
    ({"tp": 2}, "tp"), ({"pp": 2}, "pp"), ({"dp": 2}, "dp"), ({"recompute": "some"},
                                                               "recompute"),
    ({"micro_batch": 0}, "micro_batch"), ({"zero_stage": 4}, "zero_stage"),
])
def test_plans_that_cannot_be_applied_name_the_field(changes: dict, field: str) -> None:
    with pytest.raises(SpecError) as error:
        apply_plan(ReferenceGPT(TINY), {"micro_batch": 1, **changes})
    assert error.value.field == field
    assert f"'{field}'" in str(error.value)


def test_selective_without_an_attention_core_submodule() -> None:
    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.linear(x))

    model = torch.nn.Sequential(*[Layer() for _ in range(2)])
    with pytest.raises(SpecError, match="attention-core") as error:
        apply_plan(model, {"recompute": "selective"}, layers=list(model), selective="core")
    assert error.value.field == "recompute"
    applied = apply_plan(model, {"recompute": "selective"}, layers=list(model))
    assert applied.recomputed == list(model)  # the operator policy over the whole layer
    x = torch.randn(4, 8, requires_grad=True)
    model(x).sum().backward()
    assert x.grad is not None


def test_a_job_asks_for_its_plan(tmp_path: Path) -> None:
    assert get_plan(env={}) is None
    default = {"micro_batch": 4, "accumulation": 2, "recompute": "selective"}
    assert get_plan(default, env={}) == TrainingPlan(micro_batch=4, accumulation=2,
                                                     recompute="selective")
    chosen = {"dp": 1, "micro_batch": 2, "accumulation": 4, "recompute": "full",
              "recompute_fraction": 0.5, "zero_stage": 0, "memory_bytes": 123}
    from_env = get_plan(default, env={"SHOAL_PLAN": json.dumps(chosen)})
    assert from_env == TrainingPlan(micro_batch=2, accumulation=4, recompute="full",
                                    recompute_fraction=0.5)
    path = tmp_path / "plans.json"
    path.write_text(json.dumps({"plans": [chosen]}))
    assert get_plan(env={"SHOAL_PLAN": str(path)}) == from_env
    with pytest.raises(TrainEnvError, match=r"SHOAL_PLAN.*not valid JSON"):
        get_plan(env={"SHOAL_PLAN": "{not json"})
    with pytest.raises(TrainEnvError, match=r"SHOAL_PLAN.*'micro_batch'"):
        get_plan(env={"SHOAL_PLAN": '{"micro_batch": 0}'})
    with pytest.raises(TrainEnvError, match="cannot read a plan"):
        get_plan(env={"SHOAL_PLAN": str(tmp_path / "missing.json")})


# ---------------------------------------------------------------- two processes over gloo

os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
# Ranks fork from a server that has imported torch once: a launch then costs far less than a
# fresh interpreter's torch import (tens of seconds on a loaded 2-core machine).
_MP = mp.get_context("forkserver")
_MP.set_forkserver_preload(["torch", "torch.distributed.fsdp", "shoal.train",
                            "tests.perf_memory.apply_worker"])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_two_ranks(task: str, out: Path, timeout_s: float = 240.0) -> list[dict]:
    port = _free_port()
    procs = []
    try:
        for rank in range(2):
            env = {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
                   "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo",
                   "OMP_NUM_THREADS": "1"}
            proc = _MP.Process(target=apply_worker.run_rank, args=(task, str(out), env),
                               daemon=True)
            proc.start()
            procs.append(proc)
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            proc.join(max(0.1, deadline - time.monotonic()))
        assert not any(p.is_alive() for p in procs), f"{task} ranks did not finish in time"
        assert [p.exitcode for p in procs] == [0, 0]
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(5)
    return [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(2)]


@pytest.fixture(scope="module")
def fsdp_memory(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return _run_two_ranks("memory", tmp_path_factory.mktemp("fsdp") / "memory.json")


def _row(ranks_rows: list[dict], zero: int, recompute: str, accumulation: int) -> dict:
    for row in ranks_rows:
        if (row["zero_stage"], row["recompute"], row["accumulation"]) == (zero, recompute,
                                                                            accumulation):
            return row
    raise KeyError((zero, recompute, accumulation))


@pytest.mark.parametrize("recompute,accumulation", [("none", 1), ("selective", 1), ("full", 1),
                                                    ("none", 2)])
def test_fsdp_two_ranks_match_the_memory_model(fsdp_memory: list[dict], recompute: str,
                                               accumulation: int) -> None:
    for rank in fsdp_memory:
        row = _row(rank["plans"], 3, recompute, accumulation)
        assert row["sharding"] == "fsdp-zero3"
        predicted = row["predicted"]
        assert predicted["fsdp_buffers"] > 0.15 * predicted["peak"]  # sharding matters here
        assert row["after_forward"]["Activation"] == pytest.approx(predicted["activations"],
                                                                   rel=0.05)
        peak = row["peak"]["Total"] - row["peak"]["Buffer"]
        assert peak == pytest.approx(predicted["peak"], rel=0.05)
        # Between steps each rank holds half the parameters, gradients and Adam state.
        states = row["after_backward"]
        assert states["Parameter"] == predicted["params"]
        assert states["Gradient"] == predicted["grads"]
        assert states["Optstate"] == pytest.approx(predicted["optimizer"], rel=0.001)


def test_fsdp_recompute_drop_matches_the_prediction(fsdp_memory: list[dict]) -> None:
    rows = fsdp_memory[0]["plans"]
    none, selective = _row(rows, 3, "none", 1), _row(rows, 3, "selective", 1)
    drop = none["after_forward"]["Activation"] - selective["after_forward"]["Activation"]
    predicted = none["predicted"]["activations"] - selective["predicted"]["activations"]
    assert drop > 0 and predicted == pytest.approx(drop, rel=0.05)


@pytest.mark.parametrize("zero,sharding", [(0, "ddp"), (1, "ddp+zero1")])
def test_ddp_without_accumulation_matches_the_memory_model(fsdp_memory: list[dict], zero: int,
                                                           sharding: str) -> None:
    for rank in fsdp_memory:
        row = _row(rank["plans"], zero, "none", 1)
        assert row["sharding"] == sharding
        predicted, states = row["predicted"], row["after_backward"]
        # DDP's gradient buckets persist between steps: every gradient exists during backward.
        assert states["Gradient"] == predicted["grads"]
        assert states["Parameter"] == predicted["params"]
        assert row["after_forward"]["Activation"] == pytest.approx(predicted["activations"],
                                                                   rel=0.05)
        peak = row["peak"]["Total"] - row["peak"]["Buffer"]
        assert peak == pytest.approx(predicted["peak"], rel=0.05)


def test_zero2_partitions_gradients_and_optimizer_state(fsdp_memory: list[dict]) -> None:
    for rank in fsdp_memory:
        row = _row(rank["plans"], 2, "none", 2)
        assert row["sharding"] == "zero2"
        predicted, states = row["predicted"], row["after_backward"]
        assert states["Parameter"] == predicted["params"]  # replicated
        # Partitioned by whole parameters, so each rank's share is only close to 1/2.
        assert states["Gradient"] == pytest.approx(predicted["grads"], rel=0.02)
        assert states["Optstate"] == pytest.approx(predicted["optimizer"], rel=0.02)
        assert row["after_forward"]["Activation"] == pytest.approx(predicted["activations"],
                                                                   rel=0.05)
        peak = row["peak"]["Total"] - row["peak"]["Buffer"]
        assert peak == pytest.approx(predicted["peak"], rel=0.05)


def test_a_checkpoint_resumes_under_any_plan_and_world_size(tmp_path: Path) -> None:
    """A resize changes the plan and the number of ranks: the full state written under one
    (one process; two ranks under ZeRO 0-3) resumes under the other, and the losses after it
    are those of a run that never stopped."""
    global_batch = 2 * apply_worker.TRAJECTORY_PLAN["micro_batch"] \
        * apply_worker.TRAJECTORY_PLAN["accumulation"]
    steps = apply_worker.RESUME_STEPS
    reference, state = apply_worker.resume_reference(global_batch)
    assert state is not None
    torch.save(state, tmp_path / "resume.json.single.pt")
    ranks = _run_two_ranks("resume", tmp_path / "resume.json")
    assert ranks[0]["runs"] == ranks[1]["runs"]
    for name, run in ranks[0]["runs"].items():
        assert run["first"] == pytest.approx(reference[:steps], rel=1e-4), name
        # one process -> two ranks under this plan
        assert run["resumed"] == pytest.approx(reference[steps:], rel=1e-4), name
        # two ranks under this plan -> one process
        saved = torch.load(tmp_path / f"resume.json.{name}.pt", weights_only=False)
        resumed = apply_worker.resume_in_one_process(saved, global_batch)
        assert resumed == pytest.approx(reference[steps:], rel=1e-4), name
    # Without the state, the differently initialised model trains another trajectory.
    fresh, optimizer = apply_worker._fresh(TrainingPlan(micro_batch=global_batch), seed=1)
    batches = apply_worker.resume_batches(global_batch)[steps:]
    assert apply_worker._steps(fresh, optimizer, batches) != pytest.approx(reference[steps:],
                                                                          rel=1e-4)


def test_two_rank_loss_trajectories_match_single_process(tmp_path: Path) -> None:
    ranks = _run_two_ranks("trajectory", tmp_path / "trajectory.json")
    global_batch = 2 * apply_worker.TRAJECTORY_PLAN["micro_batch"] \
        * apply_worker.TRAJECTORY_PLAN["accumulation"]
    reference = apply_worker.trajectory(TrainingPlan(micro_batch=global_batch))
    assert reference[-1] < reference[0]  # it trains
    assert ranks[0]["runs"] == ranks[1]["runs"]  # every rank reports the global loss
    assert set(ranks[0]["runs"]) == {"zero0", "zero1", "zero2", "zero3", "zero3-sync-once",
                                     "zero3-full-recompute"}
    for name, losses in ranks[0]["runs"].items():
        assert losses == pytest.approx(reference, rel=1e-4), name
