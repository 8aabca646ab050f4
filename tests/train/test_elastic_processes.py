"""Real processes: resize 1 -> 2 -> 1 ranks and SIGKILL a replica; compare with an unresized run."""

from __future__ import annotations

import collections
import json
import os
import signal
from pathlib import Path

import pytest
import torch

from shoal.train import EXIT_CHECKPOINTED
from tests.train import toy_job
from tests.train.procs import launch, logs, progress, wait_all, wait_for


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The same job, uninterrupted, on one rank in this process."""
    out = tmp_path_factory.mktemp("reference")
    mp = pytest.MonkeyPatch()
    mp.setenv("TOY_OUT", str(out))
    for name in ("SHOAL_CHECKPOINT_DIR", "SHOAL_SCHEDULER_URL", "WORLD_SIZE", "RANK"):
        mp.delenv(name, raising=False)
    try:
        toy_job.main()
    finally:
        mp.undo()
    return torch.load(out / "final.pt")


def _seen(out: Path) -> collections.Counter[tuple[int, int]]:
    counts: collections.Counter[tuple[int, int]] = collections.Counter()
    for path in out.glob("samples-*.txt"):
        for line in path.read_text().splitlines():
            epoch, index = map(int, line.split())
            counts[(epoch, index)] += 1
    return counts


def _assert_same_params(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    for name, value in expected.items():
        torch.testing.assert_close(actual[name], value, rtol=1e-4, atol=1e-5)


def test_resized_run_sees_each_sample_once_and_matches_unresized(
    tmp_path: Path, reference: dict[str, torch.Tensor]
) -> None:
    # 1 rank, asked to resize through the .resize file ...
    procs = launch(1, tmp_path, TOY_SLEEP="0.05")
    wait_for(lambda: progress(tmp_path) >= 5)
    (tmp_path / "checkpoint" / ".resize").touch()
    assert wait_all(procs) == [EXIT_CHECKPOINTED], logs(tmp_path)
    assert not (tmp_path / "checkpoint" / ".resize").exists()
    first_stop = progress(tmp_path)

    # ... restarted on 2 ranks mid-epoch, asked to resize with SIGTERM ...
    procs = launch(2, tmp_path, TOY_SLEEP="0.05")
    wait_for(lambda: progress(tmp_path) >= first_stop + 6)
    for proc in procs:
        os.kill(proc.pid, signal.SIGTERM)
    assert wait_all(procs) == [EXIT_CHECKPOINTED] * 2, logs(tmp_path)
    second_stop = progress(tmp_path)
    assert first_stop < second_stop < 27  # it really stopped in the middle of training

    # ... and finished on 1 rank.
    assert wait_all(launch(1, tmp_path)) == [0], logs(tmp_path)
    restored = sorted(
        json.loads(p.read_text())["world_size"] for p in tmp_path.glob("restored-*.json")
    )
    assert restored == [1, 1, 2]  # the 2-rank start read a 1-rank checkpoint, and back

    seen = _seen(tmp_path)
    expected = {(e, i) for e in range(3) for i in range(toy_job.NUM_SAMPLES)}
    assert set(seen) == expected
    assert set(seen.values()) == {1}, "a sample was seen twice"
    _assert_same_params(torch.load(tmp_path / "final.pt"), reference)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 27 and summary["samples"] == 3 * toy_job.NUM_SAMPLES
    replicas = {row["num_replicas"] for row in summary["profile"]}
    assert replicas == {1, 2}  # step times were measured, and kept, for both configurations


def test_sigkill_resumes_from_last_periodic_checkpoint(
    tmp_path: Path, reference: dict[str, torch.Tensor]
) -> None:
    procs = launch(2, tmp_path, TOY_SLEEP="0.05", TOY_CKPT_STEPS="4")
    wait_for(lambda: progress(tmp_path) >= 10)
    os.kill(procs[1].pid, signal.SIGKILL)
    codes = wait_all(procs, timeout_s=30)
    assert codes[1] == -signal.SIGKILL and codes[0] != 0  # the survivor fails, it does not hang
    killed_at = progress(tmp_path)

    assert wait_all(launch(1, tmp_path, TOY_CKPT_STEPS="4")) == [0], logs(tmp_path)
    (meta,) = [json.loads(p.read_text()) for p in tmp_path.glob("restored-*.json")]
    assert meta["world_size"] == 2
    assert 4 <= meta["step"] <= killed_at < 27
    seen = _seen(tmp_path)
    assert {i for (_, i) in seen} == set(range(toy_job.NUM_SAMPLES))
    # Samples after the checkpoint were trained twice (once lost with the killed run).
    assert max(seen.values()) == 2
    _assert_same_params(torch.load(tmp_path / "final.pt"), reference)
