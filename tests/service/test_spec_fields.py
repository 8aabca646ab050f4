"""Job spec fields a training job's processes see: batch bounds and the working directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shoal.backends.local.backend import LocalBackend
from shoal.backends.local.devices import DevicePool
from shoal.backends.local.job import RunSettings
from shoal.core.types import Allocation
from shoal.service.runner import job_workdir
from shoal.spec.errors import SpecError
from shoal.spec.job import load_job_yaml
from tests.service.helpers import REPO, all_done, running_service, wait_until

SPEC = """name: bounded
application: tiny
batch_size: 16
max_batch_size: 128
max_local_bsz: 32
command: ["python", "train.py"]
"""


def _backend(tmp_path: Path) -> LocalBackend:
    return LocalBackend(RunSettings(home=tmp_path, pool=DevicePool("cpu", 2, 1)))


def test_batch_bounds_reach_the_limits_and_the_replica_environment(tmp_path: Path) -> None:
    backend = _backend(tmp_path)
    limits = backend.admit(load_job_yaml(SPEC), tmp_path)
    assert (limits.init_batch_size, limits.max_batch_size, limits.max_local_bsz) == (16, 128, 32)
    job = backend.jobs["bounded"]
    env = job.contract_environment(Allocation("cpu", (0, 0)), 1, 29500)
    assert env["SHOAL_MAX_BATCH_SIZE"] == "128" and env["SHOAL_MAX_LOCAL_BSZ"] == "32"

    # The job reports looser bounds of its own script: the spec's still cap them.
    job.on_report({"init_batch_size": 16, "max_batch_size": 512, "max_local_bsz": 64})
    assert (job.limits.max_batch_size, job.limits.max_local_bsz) == (128, 32)
    # A tighter bound the script reports wins, also in the next start's environment.
    job.on_report({"init_batch_size": 16, "max_batch_size": 64, "max_local_bsz": 8})
    assert (job.limits.max_batch_size, job.limits.max_local_bsz) == (64, 8)
    env = job.contract_environment(Allocation("cpu", (0,)), 0, 29500)
    assert env["SHOAL_MAX_LOCAL_BSZ"] == "8"


def test_without_bounds_the_batch_is_fixed_until_the_job_reports_its_own(tmp_path: Path) -> None:
    backend = _backend(tmp_path)
    spec = load_job_yaml(SPEC.replace("max_batch_size: 128\nmax_local_bsz: 32\n", ""))
    limits = backend.admit(spec, tmp_path)
    assert (limits.max_batch_size, limits.max_local_bsz) == (16, 16)
    env = backend.jobs["bounded"].contract_environment(Allocation("cpu", (0,)), 0, 29500)
    assert "SHOAL_MAX_BATCH_SIZE" not in env and "SHOAL_MAX_LOCAL_BSZ" not in env


def test_workdir_is_relative_to_the_submitting_directory(tmp_path: Path) -> None:
    (tmp_path / "project").mkdir()
    spec = load_job_yaml(SPEC + "workdir: project\n")
    assert job_workdir(spec, tmp_path) == (tmp_path / "project").resolve()
    assert job_workdir(load_job_yaml(SPEC), tmp_path) == tmp_path
    absolute = load_job_yaml(SPEC + f"workdir: {tmp_path / 'project'}\n")
    assert job_workdir(absolute, Path("/")) == (tmp_path / "project").resolve()
    with pytest.raises(SpecError) as error:
        job_workdir(load_job_yaml(SPEC + "workdir: missing\n"), tmp_path)
    assert error.value.field == "workdir"
    with pytest.raises(SpecError) as error:
        load_job_yaml(SPEC.replace("max_batch_size: 128", "max_batch_size: 8"))
    assert error.value.field == "max_batch_size"


def test_command_runs_in_the_spec_workdir(tmp_path: Path) -> None:
    script = (
        "import json, os, pathlib; pathlib.Path(os.environ['SHOAL_CHECKPOINT_DIR'], 'seen.json')"
        ".write_text(json.dumps({'cwd': os.getcwd(), 'max_batch': os.environ"
        "['SHOAL_MAX_BATCH_SIZE'], 'max_local': os.environ['SHOAL_MAX_LOCAL_BSZ']}))"
    )
    command = json.dumps(["python", "-c", script])
    spec = SPEC.replace('command: ["python", "train.py"]', f"command: {command}")
    with running_service(tmp_path / "home") as service:
        response = service.submit(spec + "workdir: tests/local\n")
        assert response.status_code == 201, response.text
        wait_until(lambda: all_done(service, ["bounded"]), 60, "the job to finish",
                   service.diagnostics)
        assert service.job("bounded")["state"] == "finished", service.diagnostics()
        seen = json.loads((service.home / "checkpoints" / "bounded" / "seen.json").read_text())
        assert seen == {"cwd": str(REPO / "tests" / "local"), "max_batch": "128",
                        "max_local": "32"}
        missing = service.submit(SPEC.replace("bounded", "lost") + "workdir: no/such/dir\n")
        assert missing.status_code == 422
        assert missing.json()["detail"]["field"] == "workdir"
        assert "lost" not in {j["name"] for j in service.jobs()}
