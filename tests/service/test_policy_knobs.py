"""A service runs its policy with the restart charge and shoal knobs it was started with, says
so in /api/cluster, and a replay of its run uses the same ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from shoal.cli.main import cli
from shoal.policy.pollux import PolluxPolicy
from shoal.policy.registry import policy_knobs, tuned_policy
from shoal.policy.shoal import ShoalKnobs, ShoalPolicy
from shoal.service import replay
from shoal.spec.errors import SpecError
from tests.service.helpers import running_service


def test_the_restart_delay_reaches_the_shoal_policy_and_knobs_win_over_it() -> None:
    policy = tuned_policy("shoal", ["alpha=0.8"], restart_delay=7.0)
    assert isinstance(policy, ShoalPolicy)
    assert policy.restart_delay == 7.0 and policy.knobs.restart_delay == 7.0
    assert policy.knobs.alpha == 0.8
    assert policy_knobs(policy) == {"alpha": 0.8, "restart_delay": 7.0}
    explicit = tuned_policy("shoal", ["restart_delay=45"], restart_delay=7.0)
    assert explicit.restart_delay == 45.0
    ablation = tuned_policy("shoal-no-heterogeneity", {"alpha": 0.8})
    assert ablation.name == "shoal-no-heterogeneity"
    assert not ablation.knobs.heterogeneity and ablation.knobs.alpha == 0.8
    pollux = tuned_policy("pollux", (), restart_delay=7.0)
    assert isinstance(pollux, PolluxPolicy) and pollux.restart_delay == 7.0
    assert policy_knobs(pollux) == {}


def test_a_negative_restart_delay_is_refused_by_the_knob_check() -> None:
    policy = ShoalPolicy()
    with pytest.raises(SpecError) as error:
        policy.restart_delay = -1.0
    assert error.value.field == "restart_delay"
    assert policy.restart_delay == ShoalKnobs().restart_delay


def test_bad_knobs_name_the_field_and_the_fix() -> None:
    with pytest.raises(SpecError, match="not 'pollux'") as other:
        tuned_policy("pollux", ["alpha=0.8"])
    assert other.value.field == "knob"
    with pytest.raises(SpecError, match="KEY one of") as unknown:
        tuned_policy("shoal", ["alhpa=0.8"])
    assert unknown.value.field == "knob"
    with pytest.raises(SpecError, match="unknown policy"):
        tuned_policy("magic")


def test_shoal_up_refuses_a_bad_knob_before_starting_anything(tmp_path: Path) -> None:
    home = tmp_path / "home"
    result = CliRunner().invoke(cli, ["up", "--home", str(home), "--policy", "shoal",
                                      "--knob", "sigma=1.5"])
    assert result.exit_code == 2, result.output
    assert "sigma" in result.output
    assert not (home / "service.json").exists()


def test_shoal_up_passes_crash_retry_settings_to_the_service(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shoal.cli import up
    from shoal.service.__main__ import parse_args
    from shoal.service.launch import service_command

    started: dict[str, Any] = {}

    def start(home: Path, port: int | None, **options: object) -> tuple[str, int]:
        started.update(options)
        return "http://127.0.0.1:1", 1

    monkeypatch.setattr(up, "start_background", start)
    result = CliRunner().invoke(cli, ["up", "--home", str(tmp_path / "home"),
                                      "--max-retries", "5", "--backoff", "0.5"])
    assert result.exit_code == 0, result.output
    config = parse_args(service_command(tmp_path / "home", 1, started)[3:])
    assert config.max_retries == 5 and config.backoff_s == 0.5
    refused = CliRunner().invoke(cli, ["up", "--home", str(tmp_path / "home"),
                                       "--max-retries", "-1"])
    assert refused.exit_code == 2 and "--max-retries" in refused.output


def test_the_service_reports_the_knobs_it_runs_and_the_replay_reuses_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with running_service(tmp_path / "home", policy="shoal", restart_delay=7.0,
                         knob=["alpha=0.8", "growth=2"]) as service:
        cluster = service.get("/api/cluster")
    assert cluster["policy"] == "shoal"
    assert cluster["restart_delay_s"] == 7.0
    assert cluster["knobs"] == {"alpha": 0.8, "growth": 2.0, "restart_delay": 7.0}

    run = replay.MeasuredRun(
        profiles=tmp_path, jobs=[], cluster=None, policy=cluster["policy"],  # type: ignore[arg-type]
        interval_s=cluster["interval_s"], policy_restart_delay=cluster["restart_delay_s"],
        costs=replay.RestartCosts(0.0, 0.0, 0.0, 0.0), real_jct={"a": 1.0},
        policy_knobs=cluster["knobs"])
    seen: dict[str, Any] = {}

    def fake_simulate(jobs: object, policy: ShoalPolicy, *args: object, **kwargs: object) -> None:
        seen["policy"] = policy

    monkeypatch.setattr("shoal.backends.sim.run.simulate", fake_simulate)
    monkeypatch.setattr("shoal.backends.sim.profile.ProfileLibrary", lambda path: path)
    replay.simulate_run(run)
    assert seen["policy"].knobs == ShoalKnobs(alpha=0.8, growth=2.0, restart_delay=7.0)
