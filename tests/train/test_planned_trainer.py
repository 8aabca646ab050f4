"""``PlannedTrainer``: a job trains under the plan it is given, checkpoints on a resize request
and resumes under another plan and world size, every step exactly once.

The ranks are real processes (gloo) running ``examples/gpt_planned/train.py`` with the
environment a backend sets, each plan passed in ``SHOAL_PLAN``.
"""

from __future__ import annotations

import importlib.util
import json
import multiprocessing as mp
import os
import signal
from multiprocessing.process import BaseProcess
from pathlib import Path

import pytest
import torch

import shoal.train as st
from shoal.spec.errors import SpecError
from shoal.train.apply import TrainingPlan
from shoal.train.checkpoint import FILE_NAME
from shoal.train.plan import ReferenceGPT
from shoal.train.signals import RESIZE_FILE
from tests.train.procs import free_port, wait_all, wait_for

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpt_planned" / "train.py"
MODEL = "gpt:layers=2,hidden=64,heads=2,seq=32,vocab=128"
STEPS = 12
ARGS = ["--batch-size", "8", "--tokens", str(STEPS * 8 * 32)]
_MP = mp.get_context("forkserver")
_MP.set_forkserver_preload(["torch", "shoal.train"])


def _run_example(env: dict[str, str], argv: list[str], log_path: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(env)
    spec = importlib.util.spec_from_file_location("gpt_planned_train", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(argv)


def _run(plan: TrainingPlan, checkpoint: Path, out: Path,
         interval_s: float = 3600) -> list[int | None]:
    """All ranks of one run under ``plan``; their exit codes."""
    return wait_all(_start(plan, checkpoint, out, interval_s), timeout_s=120)


def _start(plan: TrainingPlan, checkpoint: Path, out: Path,
           interval_s: float = 3600) -> list[BaseProcess]:
    port = free_port()
    procs = []
    for rank in range(plan.dp):
        env = {"RANK": str(rank), "WORLD_SIZE": str(plan.dp), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(plan.dp), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
               "SHOAL_JOB": "gpt", "SHOAL_CHECKPOINT_DIR": str(checkpoint),
               "SHOAL_CHECKPOINT_INTERVAL": str(interval_s),
               "SHOAL_PLAN": json.dumps({k: getattr(plan, k) for k in plan.__slots__})}
        log = out / f"dp{plan.dp}-rank{rank}.log"
        proc = _MP.Process(target=_run_example, args=(env, ARGS, str(log)), daemon=True)
        proc.start()
        procs.append(proc)
    return procs


def _logs(out: Path) -> str:
    return "\n".join(f"== {p.name}\n{p.read_text()}" for p in sorted(out.glob("*.log")))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """The losses of the job run on one rank from start to end."""
    out = tmp_path_factory.mktemp("reference")
    plan = TrainingPlan(dp=1, micro_batch=8)
    assert _run(plan, out / "checkpoint", out) == [0], _logs(out)
    return json.loads((out / "checkpoint" / "result.json").read_text())["losses"]


SHARDED = [
    (TrainingPlan(dp=2, micro_batch=2, accumulation=2, zero_stage=2), "zero2",
     TrainingPlan(dp=1, micro_batch=2, accumulation=4, recompute="full"), "none"),
    (TrainingPlan(dp=2, micro_batch=4, zero_stage=3), "fsdp-zero3",
     TrainingPlan(dp=2, micro_batch=1, accumulation=4, zero_stage=1), "ddp+zero1"),
]


@pytest.mark.parametrize(("first", "first_sharding", "second", "second_sharding"), SHARDED)
def test_a_resize_moves_the_job_to_another_plan_without_losing_a_step(
        tmp_path: Path, uninterrupted: list[float], first: TrainingPlan, first_sharding: str,
        second: TrainingPlan, second_sharding: str) -> None:
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    # A resize request already waiting: the two ranks agree on it at their first control step
    # (every 4 steps), so the first run does exactly 4 steps.
    (checkpoint / RESIZE_FILE).touch()
    assert _run(first, checkpoint, tmp_path) == [st.EXIT_CHECKPOINTED] * 2, _logs(tmp_path)
    assert (checkpoint / FILE_NAME).exists() and not (checkpoint / RESIZE_FILE).exists()
    # Each rank wrote its own part of the model and optimizer state, next to state.pt.
    parts = sorted(p.name for p in (checkpoint / "plan-000000004").glob("*.distcp"))
    assert parts == ["__0_0.distcp", "__1_0.distcp"]
    assert _run(second, checkpoint, tmp_path) == [0] * second.dp, _logs(tmp_path)

    result = json.loads((checkpoint / "result.json").read_text())
    runs = result["runs"]
    assert [(r["world_size"], r["sharding"], r["first_step"]) for r in runs] == [
        (2, first_sharding, 1), (second.dp, second_sharding, 5)]
    assert TrainingPlan(**runs[1]["plan"]) == second
    assert result["steps"] == len(result["losses"]) == STEPS  # every step exactly once
    # Same data, same initial weights: the resized run follows the uninterrupted one.
    assert result["losses"] == pytest.approx(uninterrupted, rel=1e-4)
    assert uninterrupted[-1] < 0.5 * uninterrupted[0]


def test_a_killed_job_resumes_from_its_last_complete_checkpoint(
        tmp_path: Path, uninterrupted: list[float]) -> None:
    """Checkpoints at every step (a 1 ms interval); a SIGKILL mid-run loses at most the step in
    flight, and the next run continues from the checkpoint ``state.pt`` names."""
    checkpoint = tmp_path / "checkpoint"
    plan = TrainingPlan(dp=1, micro_batch=4, accumulation=2)
    (proc,) = _start(plan, checkpoint, tmp_path, interval_s=0.001)
    wait_for(lambda: "step=6 " in _logs(tmp_path) or not proc.is_alive(), timeout_s=60)
    assert proc.is_alive(), _logs(tmp_path)
    assert proc.pid is not None
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    saved = torch.load(checkpoint / FILE_NAME, weights_only=False)["objects"]["planned_trainer"]
    assert saved["steps"] >= 5 and (checkpoint / saved["shards"]).is_dir()
    assert _run(plan, checkpoint, tmp_path) == [0], _logs(tmp_path)
    result = json.loads((checkpoint / "result.json").read_text())
    assert result["runs"][1]["first_step"] == saved["steps"] + 1
    assert result["steps"] == len(result["losses"]) == STEPS
    assert result["losses"] == pytest.approx(uninterrupted, rel=1e-4)
    # The folder the crash left half-written is gone; the one state.pt names stays.
    assert [p.name for p in checkpoint.glob("plan-*")] == [saved["shards"]]


def test_a_plan_that_does_not_match_the_script_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("SHOAL_CHECKPOINT_DIR", "SHOAL_SCHEDULER_URL", "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SHOAL_PLAN", json.dumps({"dp": 1, "micro_batch": 4, "accumulation": 1}))
    from shoal.perf.catalog import parse_model

    st.init()
    try:
        model = ReferenceGPT(parse_model(MODEL), dropout=0.0)
        with pytest.raises(SpecError) as error:
            st.PlannedTrainer(model, torch.optim.AdamW, global_batch=8)
        assert error.value.field == "batch_size" and "global batch is 4" in str(error.value)
        trainer = st.PlannedTrainer(model, torch.optim.AdamW, global_batch=4)
        assert trainer.plan == TrainingPlan(micro_batch=4)
        with pytest.raises(RuntimeError, match="one trainer"):
            st.PlannedTrainer(model, torch.optim.AdamW, global_batch=4)
        with pytest.raises(RuntimeError, match="local_share"):
            trainer.begin_micro_batch()
    finally:
        st.shutdown()
