"""Exporting a real run for the simulator, and the simulator's model of the local backend."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from shoal.backends.sim.backend import SimBackend
from shoal.backends.sim.job import SimJob
from shoal.backends.sim.profile import ProfileLibrary
from shoal.core.types import Allocation
from shoal.service.replay import (
    export_run,
    measured_steps,
    placement_rows,
    restart_costs,
    simulate_run,
    validation_rows,
)

# What a job of 64 samples per epoch reports: 1 replica at micro-batch 8 (with one accumulation
# step every few steps) and 16, then 2 replicas at 16.
PROFILE = [
    {"num_nodes": 1, "num_replicas": 1, "local_bsz": 8, "accum_steps": 1, "step_time": 0.30,
     "sync_time": 0.0, "count": 10},
    {"num_nodes": 1, "num_replicas": 1, "local_bsz": 16, "accum_steps": 0, "step_time": 0.25,
     "sync_time": 0.0, "count": 40},
    {"num_nodes": 1, "num_replicas": 2, "local_bsz": 16, "accum_steps": 0, "step_time": 0.29,
     "sync_time": 0.04, "count": 30},
]
TRACE = [
    {"epoch": e, "progress": 64.0 * (e + 1), "samples": 64 * (e + 1), "steps": 4 * (e + 1),
     "grad_sqr": None if e == 0 else 2.0 / (e + 1), "grad_var": None if e == 0 else 1.0,
     "time": 100.0 + e}
    for e in range(4)
]


def _job(name: str, submit: float, details: list[dict[str, Any]], finish: float,
         trace: list[dict[str, Any]] = TRACE) -> dict:
    return {
        "name": name, "state": "finished", "submit_time": submit, "finish_time": finish,
        "jct": finish - submit, "profile": PROFILE, "epochs": trace, "run_details": details,
        "bounds": {"init_batch_size": 16, "max_batch_size": 64, "max_local_bsz": 32},
        "spec": {"name": name, "application": "x", "batch_size": 16, "max_replicas": 2,
                 "min_replicas": 1},
    }


CLUSTER = {"device_type": "cpu", "nodes": [{"node_id": 0, "capacity": 2}], "policy": "pollux",
           "interval_s": 1.0, "restart_delay_s": 2.0}


def test_measured_steps_keep_the_step_time_with_accumulation() -> None:
    steps = measured_steps(PROFILE)
    step, sync = steps[(1, 1, 8)]
    assert step + (step - sync) * 1 == pytest.approx(0.30)  # how the simulator times it
    assert steps[(1, 2, 16)] == pytest.approx((0.29, 0.04))


def test_placement_rows_cover_every_configuration_measured_first() -> None:
    rows = placement_rows(PROFILE, max_replicas=2, max_local_bsz=32, per_node=2)
    table = {(r["placement"], r["local_bsz"]): r for r in rows}
    assert {p for p, _ in table} == {"1", "2"}
    assert {b for _, b in table} == {1, 2, 4, 8, 16, 32}
    assert table[("1", 16)]["source"] == "measured"
    assert table[("1", 16)]["step_time"] == pytest.approx(0.25)
    assert table[("2", 8)]["source"] == "model"
    # The fitted model is monotone in the micro-batch, as measured.
    ones = [table[("1", b)]["step_time"] for b in (1, 2, 4, 8, 16, 32)]
    assert ones == sorted(ones)


def test_validation_rows_are_progress_in_initial_iterations() -> None:
    rows = validation_rows(TRACE, init_batch=16, batch_size=64)
    assert [r["progress"] for r in rows] == [4.0, 8.0, 12.0, 16.0]
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4]
    # The first epoch ended before the noise was measured: the first estimate stands in.
    assert (rows[0]["grad_sqr"], rows[0]["grad_var"]) == (1.0, 1.0)
    assert math.isnan(rows[0]["metric"])


def test_restart_costs_from_run_details() -> None:
    details = [
        {"kind": "start", "requested": 10.0, "time": 10.0, "first_step": 16.0,
         "checkpointed": 30.0},
        {"kind": "resize", "requested": 22.0, "time": 30.5, "first_step": 31.0, "done": 40.0},
    ]
    costs = restart_costs([_job("a", 9.0, details, finish=41.0),
                           _job("b", 20.0, [{"kind": "start", "requested": 20.0,
                                             "first_step": 30.0, "done": 50.0}], 50.5)])
    assert costs.start_delay == pytest.approx(8.0)  # (6 + 10) / 2
    assert costs.resize_overlap == pytest.approx(8.0)  # decision 22 -> checkpoint 30
    assert costs.restart_delay == pytest.approx(1.0)  # checkpoint 30 -> first step 31
    assert costs.finish_delay == pytest.approx(0.75)
    assert (costs.count_starts, costs.count_resizes, costs.count_finishes) == (2, 1, 2)


def test_exported_run_loads_as_simulator_profiles_and_replays(tmp_path: Path) -> None:
    details = [{"kind": "start", "requested": 0.5, "first_step": 3.5, "done": 10.0}]
    jobs = [_job("a", 0.0, details, 11.0), _job("b", 4.0, [dict(details[0], requested=4.5,
                                                                 first_step=7.5)], 15.0)]
    run = export_run(jobs, CLUSTER, tmp_path)
    app = ProfileLibrary(tmp_path).get("a")
    assert (app.init_batch_size, app.max_batch_size) == (16, 64)
    assert (app.min_local_bsz, app.max_local_bsz) == (1, 32)
    assert app.step_and_sync((1,), 16, "cpu") == pytest.approx((0.25, 0.0))
    assert app.progress_at(4) == pytest.approx(16.0)
    assert [j.submit_time for j in run.jobs] == [0.0, 4.0]
    assert (tmp_path / "run.json").exists()
    result = simulate_run(run)
    assert all(r.finish_time is not None and not r.failure for r in result.records)


def test_shoal_replay_reruns_an_exported_run_under_other_policies(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from shoal.cli.main import cli
    from shoal.service.replay import MeasuredRun, compare

    details = [{"kind": "start", "requested": 0.5, "first_step": 3.5, "done": 10.0}]
    jobs = [_job("a", 0.0, details, 11.0), _job("b", 4.0, [dict(details[0], requested=4.5,
                                                                 first_step=7.5)], 15.0)]
    run = export_run(jobs, {**CLUSTER, "policy": "shoal", "knobs": {"growth": 2.0}},
                     tmp_path / "exported")
    loaded = MeasuredRun.from_json(json.loads((tmp_path / "exported" / "run.json").read_text()))
    assert loaded == run
    moved = (tmp_path / "exported").rename(tmp_path / "moved")  # run.json names the old folder
    out = tmp_path / "replay.json"
    result = CliRunner().invoke(cli, ["replay", str(moved), "--policy", "pollux,shoal",
                                      "--knob", "p=-1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "sim pollux" in result.output and "sim shoal" in result.output
    replays = json.loads(out.read_text())["replays"]
    assert replays["pollux"]["real_avg_jct_s"] == pytest.approx(11.0)  # (11 + 11) / 2
    # Each column is the simulator's run of that policy; shoal keeps the run's knobs and adds
    # those given.
    what_if = replace(loaded, profiles=moved, policy_knobs={"growth": 2.0, "p": -1.0})
    assert replays["shoal"]["sim_avg_jct_s"] == pytest.approx(
        compare(what_if, simulate_run(what_if))["sim_avg_jct_s"])
    assert replays["pollux"]["sim_avg_jct_s"] is not None
    bad = CliRunner().invoke(cli, ["replay", str(moved), "--policy", "nope"])
    assert bad.exit_code == 2 and "unknown policy ['nope']" in bad.output
    no_shoal = CliRunner().invoke(cli, ["replay", str(moved), "--policy", "pollux", "--knob",
                                        "p=-1"])
    assert no_shoal.exit_code == 2 and "knobs tune the shoal policies" in no_shoal.output


def _sim_job(tmp_path: Path, **costs: float) -> SimJob:
    """A simulated job from an exported profile: 4 epochs of 40 iterations at batch 16."""
    trace = [dict(row, progress=640.0 * (row["epoch"] + 1)) for row in TRACE]
    details = [{"kind": "start", "requested": 0.0, "first_step": 1.0}]
    run = export_run([_job("a", 0.0, details, 9.0, trace)], CLUSTER, tmp_path)
    profiles = ProfileLibrary(tmp_path)
    limits = SimBackend(run.cluster, profiles).admit(run.jobs[0])
    return SimJob("a", profiles.get("a"), limits, 0.0, costs.pop("restart_delay"), 4, **costs)


def test_sim_job_charges_start_and_resize_costs_separately(tmp_path: Path) -> None:
    one, two = Allocation("cpu", (0,)), Allocation("cpu", (0, 0))
    job = _sim_job(tmp_path, restart_delay=1.0, start_delay=5.0, resize_overlap=3.0)
    job.reallocate(one, 16)
    job.advance(0.0, 5.0)
    assert job.progress == 0.0  # a start from nothing: 5 s without progress
    job.advance(5.0, 2.0)
    rate_one = job.progress / 2.0
    assert rate_one > 0
    job.reallocate(two, 32)
    job.advance(7.0, 3.0)  # the old replica keeps training while the new ones warm up
    assert job.progress == pytest.approx(5 * rate_one)
    job.advance(10.0, 1.0)  # then a short pause
    assert job.progress == pytest.approx(5 * rate_one)
    job.advance(11.0, 1.0)
    assert job.progress > 5 * rate_one


def test_sim_job_defaults_keep_one_restart_delay(tmp_path: Path) -> None:
    job = _sim_job(tmp_path, restart_delay=4.0)
    job.reallocate(Allocation("cpu", (0,)), 16)
    job.advance(0.0, 4.0)
    assert job.progress == 0.0
    job.advance(4.0, 1.0)
    progress = job.progress
    job.reallocate(Allocation("cpu", (0, 0)), 32)
    job.advance(5.0, 4.0)
    assert job.progress == progress  # no overlap: the whole restart delay is lost


def test_sim_job_holds_its_devices_for_the_finish_delay(tmp_path: Path) -> None:
    quick = _sim_job(tmp_path / "a", restart_delay=0.0)
    slow = _sim_job(tmp_path / "b", restart_delay=0.0, finish_delay=2.5)
    for job in (quick, slow):
        job.reallocate(Allocation("cpu", (0,)), 16)
        now = 0.0
        while job.finished_at is None:
            job.advance(now, 1.0)
            now += 1.0
    assert slow.finished_at == pytest.approx(quick.finished_at + 2.5)


def test_epochs_shorter_than_the_time_resolution_still_take_their_time(tmp_path: Path) -> None:
    """The Pollux simulator ends epochs on whole seconds; a real run's epochs can take 10 ms,
    which that rounding would finish in no time. The replay simulates exact times."""
    fast = [dict(row, step_time=row["step_time"] / 100, sync_time=row["sync_time"] / 100)
            for row in PROFILE]
    details = [{"kind": "start", "requested": 0.0, "first_step": 0.0}]
    run = export_run([dict(_job("a", 0.0, details, 1.0), profile=fast)], CLUSTER, tmp_path)
    profiles = ProfileLibrary(tmp_path)
    limits = replace(SimBackend(run.cluster, profiles).admit(run.jobs[0]), fixed_batch=16)
    finished = {}
    for resolution in (1.0, 0.0):
        job = SimJob("a", profiles.get("a"), limits, 0.0, 0.0, 4, time_resolution=resolution)
        job.reallocate(Allocation("cpu", (0,)), 16)
        job.advance(0.0, 1.0)
        finished[resolution] = job.finished_at
    assert finished[1.0] == 0.0
    # 4 epochs of 4 steps at batch 16, 2.5 ms each
    assert finished[0.0] == pytest.approx(4 * 4 * 0.0025)
