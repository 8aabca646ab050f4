"""``shoal plan`` end to end through click."""

from __future__ import annotations

import json

from click.testing import CliRunner

from shoal.cli.plan import plan_command

GPT_7B = "gpt:layers=32,hidden=4096,heads=32,seq=2048,vocab=51200"
KEYS = {"dp", "tp", "pp", "virtual_stages", "micro_batch", "accumulation", "recompute",
        "zero_stage", "offload", "memory_bytes", "step_time_s"}


def test_json_to_stdout_lists_plans_best_first() -> None:
    result = CliRunner().invoke(plan_command, ["--model", GPT_7B, "--devices", "8xa100-80g",
                                               "--global-batch", "512", "--json", "-"])
    assert result.exit_code == 0, result.output
    plans = json.loads(result.output)["plans"]
    assert plans and set(plans[0]) >= KEYS
    times = [p["step_time_s"] for p in plans]
    assert times == sorted(times)
    assert all(p["memory_bytes"] <= 80 * 2**30 for p in plans)
    assert all(p["dp"] * p["tp"] * p["pp"] == 8 for p in plans)


def test_table_and_json_file(tmp_path) -> None:
    out = tmp_path / "plans.json"
    result = CliRunner().invoke(plan_command, ["--model", GPT_7B, "--devices", "16xa100-40g",
                                               "--global-batch", "256", "--json", str(out),
                                               "--top", "3"])
    assert result.exit_code == 0, result.output
    assert "plans fit" in result.output
    assert json.loads(out.read_text())["plans"]


def test_bad_input_names_the_field() -> None:
    runner = CliRunner()
    bad_device = runner.invoke(plan_command, ["--model", GPT_7B, "--devices", "8xa100",
                                              "--global-batch", "8"])
    assert bad_device.exit_code == 2 and "devices" in bad_device.output
    bad_model = runner.invoke(plan_command, ["--model", "gpt:layers=2", "--devices",
                                             "8xa100-80g", "--global-batch", "8"])
    assert bad_model.exit_code == 2 and "missing" in bad_model.output
    nothing_fits = runner.invoke(plan_command, ["--model", GPT_7B, "--devices", "1xt4-16g",
                                                "--global-batch", "8"])
    assert nothing_fits.exit_code == 1 and "no plan fits" in nothing_fits.output


def test_module_factory_is_measured_and_planned() -> None:
    result = CliRunner().invoke(plan_command, [
        "--module", "tests.perf_memory.tiny_module:factory", "--devices", "2xt4-16g",
        "--global-batch", "64", "--json", "-"])
    assert result.exit_code == 0, result.output
    plans = json.loads(result.output)["plans"]
    params = 256 * 1024 + 1024 + 1024 * 10 + 10
    assert plans[0]["dp"] == 2
    # fp32 weights, gradients and two Adam moments, plus activations.
    assert plans[0]["memory_breakdown"]["params"] == 4 * params
    assert plans[0]["memory_bytes"] > 16 * params / 2


def test_named_models_plan_as_in_a_job_spec() -> None:
    """`--model` takes the names a job spec takes: llama-7b and its overrides plan as the same
    architecture written out, and a misspelled name gets the closest one."""
    runner = CliRunner()
    args = ["--devices", "8xa100-80g", "--global-batch", "64", "--json", "-", "--top", "3"]
    named = runner.invoke(plan_command, ["--model", "llama-7b:seq=4096", *args])
    written = runner.invoke(plan_command, [
        "--model", "gpt:layers=32,hidden=4096,heads=32,seq=4096,vocab=32000", *args])
    assert named.exit_code == 0 and written.exit_code == 0, named.output + written.output
    assert json.loads(named.output)["plans"] == json.loads(written.output)["plans"]
    typo = runner.invoke(plan_command, ["--model", "lama-7b", *args])
    assert typo.exit_code == 2 and "did you mean 'llama-7b'" in typo.output


def test_module_factories_import_from_the_current_directory(tmp_path) -> None:
    """The `shoal` console script finds `--module` in the directory it runs in, as `python -m`
    would; the console script alone does not put that directory on the import path."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    shutil.copy(here / "tiny_module.py", tmp_path / "my_factory.py")
    script = Path(sys.executable).parent / "shoal"
    run = subprocess.run([str(script), "plan", "--module", "my_factory:factory", "--devices",
                          "2xt4-16g", "--global-batch", "64", "--json", "-"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["plans"][0]["dp"] == 2
