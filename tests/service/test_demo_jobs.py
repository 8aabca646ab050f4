"""make demo's job files: the examples with their epochs scaled, everything else unchanged."""

from pathlib import Path

import pytest

from shoal.demo import profiled_examples, scale_epochs
from shoal.spec.job import load_job_yaml


@pytest.mark.parametrize("path", profiled_examples(), ids=lambda p: p.parent.name)
def test_scaled_examples_train_longer_and_say_so_to_the_scheduler(path: Path) -> None:
    original = load_job_yaml(path.read_text(), str(path))
    scaled = load_job_yaml(scale_epochs(path.read_text(), 4), str(path))
    assert scaled.target_epochs == 4 * original.target_epochs
    epochs = scaled.command[scaled.command.index("--epochs") + 1]
    assert int(epochs) == scaled.target_epochs  # the script trains what the scheduler expects
    unchanged = {"command", "target_epochs"}
    assert scaled.model_dump(exclude=unchanged) == original.model_dump(exclude=unchanged)
