"""Jobs that declare their model on the local backend: planned sizes and the plan of each run.

The slot memory is set so that the example GPT's training state does not fit one CPU slot
but fits two with sharding: the planner, not a measurement, decides which sizes can run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from shoal.backends.local.backend import LocalBackend
from shoal.backends.local.devices import DevicePool
from shoal.backends.local.job import PLAN_VARIABLE, RunSettings
from shoal.cli.main import cli
from shoal.core.types import Allocation
from shoal.perf.catalog import parse_model
from shoal.perf.planned import PlannedGoodput, describe_plan, planned
from shoal.spec.errors import SpecError
from shoal.spec.job import load_job_yaml
from shoal.train import get_plan
from shoal.train.apply import TrainingPlan
from tests.service.browser import chromium
from tests.service.helpers import REPO, all_done, job_yaml, running_service, wait_until

EXAMPLE = REPO / "examples" / "gpt_planned" / "job.yaml"
MODEL = "gpt:layers=2,hidden=64,heads=2,seq=32,vocab=128"
# The planner reserves 1 GiB per device. Above that, the model's training at global batch 8
# needs at least 1.82 MiB on one device (full recomputation) and 1.11 MiB per device on two
# (ZeRO-2 and full recomputation); without recomputation, 1.68 MiB on two. CPU slots do not
# offload: their memory is the host's.
ONE_TOO_SMALL_GB = 1 + 1.75 / 1024
NOTHING_FITS_GB = 1 + 1.0 / 1024


def _backend(tmp_path: Path, memory_gb: float, slots: int = 2) -> LocalBackend:
    return LocalBackend(RunSettings(home=tmp_path, pool=DevicePool("cpu", slots, 1,
                                                                   memory_gb=memory_gb)))


def _spec(**changes: object):
    text = EXAMPLE.read_text()
    for key, value in changes.items():
        text += f"{key}: {value}\n"
    return load_job_yaml(text)


def test_a_declared_model_is_planned_not_profiled(tmp_path: Path) -> None:
    backend = _backend(tmp_path, ONE_TOO_SMALL_GB)
    limits = backend.admit(_spec(), tmp_path)
    assert (limits.fixed_batch, limits.max_replicas) == (8, 2)
    job = backend.jobs["gpt-planned"]
    hints = job.model.hints(job.limits)
    model = hints.goodput["cpu"]
    assert isinstance(model, PlannedGoodput)
    # Trusted at every size without a measurement; no plan fits one slot, one fits two.
    assert hints.max_profiled_replicas == {"cpu": 2}
    assert model.optimize(1, 1).goodput == 0.0
    assert model.optimize(1, 2).goodput > 0.0
    # Progress is the tokens trained over target_tokens (20 steps of 8 x 32 tokens).
    job.on_report({"samples": 40})
    assert job.model.hints(job.limits).progress == pytest.approx(40 * 32 / 5120)


def test_a_model_no_allocation_can_hold_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as error:
        _backend(tmp_path, NOTHING_FITS_GB).admit(_spec(), tmp_path)
    assert error.value.field == "model" and "fits any allocation" in str(error.value)
    with pytest.raises(SpecError) as error:
        _backend(tmp_path, ONE_TOO_SMALL_GB).admit(_spec(rigid="true", num_replicas=1),
                                                   tmp_path)
    assert error.value.field == "num_replicas"


@pytest.mark.parametrize(("memory_gb", "replicas"), [(ONE_TOO_SMALL_GB, 2), (2.0, 1), (2.0, 2)])
def test_each_run_gets_the_plan_of_its_allocation(tmp_path: Path, memory_gb: float,
                                                  replicas: int) -> None:
    backend = _backend(tmp_path, memory_gb)
    backend.admit(_spec(), tmp_path)
    job = backend.jobs["gpt-planned"]
    env = job.contract_environment(Allocation("cpu", (0,) * replicas), 0, 29500)
    expected = planned(parse_model(MODEL), backend.pool.device(), replicas, replicas, 8,
                       "data-parallel", offload=False)
    assert expected is not None and expected.config.tp == expected.config.pp == 1
    assert get_plan(env=env) == TrainingPlan.from_config(expected.config)
    assert env["SHOAL_BATCH_SIZE"] == "8"


def test_a_restarted_service_keeps_planning_the_job(tmp_path: Path) -> None:
    first = _backend(tmp_path, ONE_TOO_SMALL_GB)
    limits = first.admit(_spec(), tmp_path)
    adopted = _backend(tmp_path, ONE_TOO_SMALL_GB).adopt(_spec(), tmp_path, limits)
    assert isinstance(adopted.model.hints(adopted.limits).goodput["cpu"], PlannedGoodput)
    env = adopted.contract_environment(Allocation("cpu", (0, 0)), 0, 29500)
    assert get_plan(env=env) is not None


def test_jobs_without_a_model_get_no_plan(tmp_path: Path) -> None:
    backend = _backend(tmp_path, 2.0)
    spec = load_job_yaml('name: plain\napplication: tiny\nbatch_size: 16\n'
                         'command: ["python", "train.py"]\n')
    backend.admit(spec, tmp_path)
    env = backend.jobs["plain"].contract_environment(Allocation("cpu", (0,)), 0, 29500)
    assert PLAN_VARIABLE not in env


def test_the_example_trains_under_the_plan_of_the_size_it_was_given(tmp_path: Path) -> None:
    with running_service(tmp_path / "home", slot_memory_gb=ONE_TOO_SMALL_GB,
                         policy="shoal") as service:
        too_big = service.submit(EXAMPLE.read_text().replace("gpt-planned", "too-big")
                                 .replace("hidden=64", "hidden=512"))
        assert too_big.status_code == 422, too_big.text
        assert too_big.json()["detail"]["field"] == "model"
        response = service.submit(EXAMPLE.read_text() + f"workdir: {REPO}\n")
        assert response.status_code == 201, response.text
        wait_until(lambda: all_done(service, ["gpt-planned"]), 180, "the job to finish",
                   service.diagnostics)
        described = service.job("gpt-planned")
        assert described["state"] == "finished", service.diagnostics()
        result = json.loads((service.home / "checkpoints" / "gpt-planned" / "result.json")
                            .read_text())
        shown = CliRunner(env={"COLUMNS": "250"}).invoke(
            cli, ["show", "gpt-planned", "--home", str(service.home)])
        page_plan = _dashboard_plan(service.url, "gpt-planned")
    assert shown.exit_code == 0, shown.output
    line = next(x for x in shown.output.splitlines() if x.startswith("parallel plan"))
    assert line.split(None, 2)[2] == describe_plan(described["plan"]), shown.output
    assert "dp 2 · ZeRO-" in shown.output
    # The dashboard's job detail writes the plan in the same words.
    assert page_plan in (None, describe_plan(described["plan"])), page_plan
    # The API says which plan the job ran under, and its progress came from its reports.
    shown = described["plan"]
    assert shown["dp"] == 2 and shown["zero_stage"] == result["plan"]["zero_stage"]
    assert shown["micro_batch"] == result["plan"]["micro_batch"]
    assert described["progress"] == 1.0
    expected = planned(parse_model(MODEL), DevicePool("cpu", 2, 1, memory_gb=ONE_TOO_SMALL_GB)
                       .device(), 2, 2, 8, "data-parallel", offload=False)
    assert expected is not None
    assert result["world_size"] == 2  # the only size a plan fits
    assert TrainingPlan(**result["plan"]) == TrainingPlan.from_config(expected.config)
    assert result["plan"]["zero_stage"] > 0  # sharded: unsharded state does not fit a slot
    assert result["steps"] == 20 and result["losses"][-1] < 0.5 * result["losses"][0]


def _dashboard_plan(url: str, job: str) -> str | None:
    """The parallel plan the dashboard shows in ``job``'s detail (None without a browser)."""
    with chromium() as browser:
        if browser is None:
            return None
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
        page.goto(url)
        page.locator(f'#jobs tr[data-job="{job}"]').click()
        plan = page.locator("#detail-plan")
        plan.wait_for(timeout=30_000)
        assert not errors, errors
        return plan.inner_text()


BOTH_FIT_GB = 1 + 2.0 / 1024  # one slot: no sharding, full recompute; two: ZeRO-2


def test_a_resize_changes_the_plan_and_the_job_resumes_where_it_stopped(
        tmp_path: Path) -> None:
    """The job runs on both slots until a heavier job arrives, is shrunk to one slot, and
    resumes there from its checkpoint under the one-slot plan: every step once, none lost."""
    steps = 400
    spec = (EXAMPLE.read_text().replace("target_tokens: 5120", f"target_tokens: {steps * 256}")
            .replace('"--tokens", "5120"', f'"--tokens", "{steps * 256}"')
            + f"workdir: {REPO}\n")
    with running_service(tmp_path / "home", slot_memory_gb=BOTH_FIT_GB,
                         policy="shoal") as service:
        assert service.submit(spec).status_code == 201
        wait_until(lambda: (service.job("gpt-planned")["allocation"] or {}).get("replicas") == 2
                   and service.job("gpt-planned")["state"] == "running", 120,
                   "the job to run on both slots", service.diagnostics)
        state = service.home / "checkpoints" / "gpt-planned"
        log = service.home / "logs" / "gpt-planned" / "rank0.log"
        wait_until(lambda: (state / "state.pt").exists()
                   or (log.exists() and "step=20 " in log.read_text()), 120,
                   "the job to train", service.diagnostics)
        # A job of a tenant with a larger share: planned on measured CPU rates, the GPT job
        # gains enough from its second slot that an equal share would not take it away.
        other = job_yaml("other", epochs=30, sleep=0.05, max_replicas=1) + "weight: 8\n"
        assert service.submit(other + f"workdir: {REPO}\n").status_code == 201
        wait_until(lambda: all_done(service, ["gpt-planned", "other"]), 240,
                   "both jobs to finish", service.diagnostics)
        assert service.job("gpt-planned")["state"] == "finished", service.diagnostics()
        result = json.loads((state / "result.json").read_text())
    runs = result["runs"]
    assert [r["world_size"] for r in runs][:2] == [2, 1], runs
    assert runs[0]["plan"]["zero_stage"] == 2 and runs[1]["plan"]["dp"] == 1
    assert runs[1]["first_step"] > 1  # resumed, not restarted from scratch
    assert result["steps"] == len(result["losses"]) == steps  # every step exactly once
    assert result["losses"][-1] < 0.5 * result["losses"][0]


def test_a_plan_reads_as_one_line() -> None:
    zero2 = {"dp": 2, "tp": 1, "pp": 1, "virtual_stages": 1, "micro_batch": 2,
             "accumulation": 2, "recompute": "full", "recompute_fraction": 0.5, "zero_stage": 2,
             "offload": False, "step_time_s": 0.01234, "memory_gib": 0.0011}
    assert describe_plan(zero2) == ("dp 2 · ZeRO-2 · micro-batch 2 x 2 · full recompute on 50% "
                                    "of layers · 1.1 MiB per device · 12.3 ms per step "
                                    "(predicted)")
    big = {**zero2, "dp": 4, "tp": 2, "pp": 4, "virtual_stages": 2, "micro_batch": 1,
           "accumulation": 16, "recompute": "selective", "recompute_fraction": 1.0,
           "zero_stage": 0, "offload": True, "step_time_s": 1.54, "memory_gib": 70.25}
    assert describe_plan(big) == ("dp 4 x tp 2 x pp 4 (2 virtual) · no sharding · offload · "
                                  "micro-batch 1 x 16 · selective recompute · 70.2 GiB per "
                                  "device · 1.5 s per step (predicted)")
