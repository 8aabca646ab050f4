"""Every example job: its YAML is a valid JobSpec and its script trains a few steps."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from shoal.spec.job import load_job_yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAMES = sorted(p.parent.name for p in EXAMPLES.glob("*/job.yaml"))


def test_there_are_at_least_four_examples() -> None:
    assert len(NAMES) >= 4


@pytest.mark.parametrize("name", NAMES)
def test_example_yaml_is_a_valid_job(name: str) -> None:
    path = EXAMPLES / name / "job.yaml"
    job = load_job_yaml(path.read_text(), str(path))
    assert job.command and job.command[1] == f"examples/{name}/train.py"
    assert (EXAMPLES / name / "train.py").exists()
    assert job.batch_size is not None and job.max_replicas is not None


@pytest.mark.parametrize("name", NAMES)
def test_example_trains(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    monkeypatch.chdir(tmp_path)  # whatever an example writes stays out of the checkout
    for var in ("SHOAL_CHECKPOINT_DIR", "SHOAL_SCHEDULER_URL", "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(var, raising=False)
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / name / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # A job that declares its model trains for a number of tokens, not epochs.
    declares_model = load_job_yaml((EXAMPLES / name / "job.yaml").read_text()).model is not None
    module.main(["--max-steps", "3", *([] if declares_model else ["--epochs", "1"])])
    out = capsys.readouterr().out
    assert "step=3" in out
    if not declares_model:
        assert "epoch 0 loss" in out
    assert list(tmp_path.iterdir()) == []  # outside shoal an example leaves no files behind
