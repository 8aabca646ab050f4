import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from shoal.cli.main import cli


def _eight_jobs(tmp_path, pollux_data):
    """The first eight jobs of Pollux workload 1, as a workload file."""
    workload = tmp_path / "w.csv"
    lines = (pollux_data / "workloads" / "workload-1.csv").read_text().splitlines()[:9]
    workload.write_text("\n".join(lines) + "\n")
    return workload


def test_sim_command_writes_report_and_plot(tmp_path, pollux_data):
    workload = _eight_jobs(tmp_path, pollux_data)
    out = tmp_path / "r.json"
    plot = tmp_path / "p.png"
    result = CliRunner().invoke(cli, [
        "sim", "--workload", str(workload), "--policy", "tiresias,pollux",
        "--profiles", str(pollux_data / "traces"), "--json", str(out), "--plot", str(plot),
    ])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert [r["summary"]["policy"] for r in report["runs"]] == ["tiresias", "pollux"]
    for run in report["runs"]:
        assert run["summary"]["finished"] == 8
        for key in ("avg_jct_s", "median_jct_s", "p99_jct_s", "makespan_s", "utilization"):
            assert run["summary"][key] > 0
        assert len(run["jobs"]) == 8
    assert plot.stat().st_size > 10_000


def test_sim_command_names_bad_arguments(tmp_path, pollux_data):
    runner = CliRunner()
    result = runner.invoke(cli, ["sim", "--workload", str(tmp_path / "none.csv")])
    assert result.exit_code == 2 and "workload" in result.output
    result = runner.invoke(cli, ["sim", "--workload", str(pollux_data / "workloads"),
                                 "--policy", "nope"])
    assert result.exit_code == 2 and "unknown policy" in result.output


def test_sim_on_a_mixed_cluster_with_t4_profiles_names_the_profiles_to_use(tmp_path,
                                                                          pollux_data):
    workload = _eight_jobs(tmp_path, pollux_data)
    result = CliRunner().invoke(cli, ["sim", "--workload", str(workload), "--cluster",
                                      "hetero-64", "--profiles", str(pollux_data / "traces")])
    assert result.exit_code == 2, result.output
    assert "'profiles'" in result.output and "['a100', 'v100']" in result.output
    assert "profiles-hetero" in result.output


def test_a_job_without_a_profile_for_a_cluster_type_is_rejected_not_crashed(tmp_path,
                                                                          pollux_data):
    """Profiles that measure a cluster's types for some applications only: the others'
    jobs are rejected with the reason, and the rest of the workload runs."""
    import shutil

    from shoal.backends.sim.profile import ProfileLibrary
    from shoal.backends.sim.run import simulate
    from shoal.policy.registry import make_policy
    from shoal.spec import load_cluster, load_workload_csv

    hetero = Path(__file__).resolve().parents[2] / "data" / "profiles-hetero"
    profiles = tmp_path / "profiles"
    shutil.copytree(hetero / "cifar10", profiles / "cifar10")
    shutil.copytree(hetero / "ncf", profiles / "ncf")
    for name in ("placements-a100.csv", "scalability-a100.csv"):
        (profiles / "ncf" / name).unlink()
    jobs = [j for j in load_workload_csv(_eight_jobs(tmp_path, pollux_data))
            if j.application in ("cifar10", "ncf")]
    assert {j.application for j in jobs} == {"cifar10", "ncf"}
    result = simulate(jobs, make_policy("shoal"), load_cluster("hetero-64"),
                      ProfileLibrary(profiles), interval=60, restart_delay=30)
    for record in result.records:
        if record.spec.application == "ncf":
            assert record.state == "failed"
            assert "['a100']" in record.failure and "profiles" in record.failure
        else:
            assert record.state == "finished"


def test_sim_knobs_tune_shoal_and_bad_knobs_are_named(tmp_path, pollux_data):
    workload = _eight_jobs(tmp_path, pollux_data)
    runner = CliRunner()
    base = ["sim", "--workload", str(workload), "--policy", "shoal",
            "--profiles", str(pollux_data / "traces"), "--json", "-"]
    default = json.loads(runner.invoke(cli, base).stdout)
    # Arrival decisions off: jobs that arrive between rounds now wait for the next one.
    rounds_only = runner.invoke(cli, [*base, "--knob", "on_arrival=false"])
    assert rounds_only.exit_code == 0, rounds_only.output
    tuned = json.loads(rounds_only.stdout)
    assert tuned["summary"]["policy"] == "shoal"

    def waits(report):
        return sum(j["start_s"] - j["submit_s"] for j in report["jobs"])

    assert waits(tuned) > waits(default)
    for knob, message in [("nope=1", "KEY one of"), ("restart_delay=soon", "valid number"),
                          ("on_arrival=maybe", "valid boolean"),
                          ("weighting=rnak", "'rank' or 'power'"), ("sigma=1", "[0, 1)")]:
        result = runner.invoke(cli, [*base, "--knob", knob])
        assert result.exit_code == 2 and message in result.output, result.output
    result = runner.invoke(cli, [*base[:4], "pollux", *base[5:], "--knob", "p=-1"])
    assert result.exit_code == 2 and "add one to the policies" in result.output


def test_sim_runs_model_declared_jobs_of_a_workload_csv_under_each_plan_mode(tmp_path):
    cluster = tmp_path / "one-node.yaml"
    cluster.write_text(
        "name: one-node\n"
        "device_types: [{name: a100-80g, memory_gb: 80, peak_tflops: 312, "
        "intra_node_gbps: 300, inter_node_gbps: 25}]\n"
        "nodes: [{device_type: a100-80g, devices_per_node: 8, count: 1}]\n")
    workload = tmp_path / "llm.csv"
    workload.write_text("name,time,application,num_replicas,batch_size,model,target_tokens\n"
                        "ft-13b,0,,8,64,llama-13b,2000000\n")
    runner = CliRunner()
    runs = {}
    for mode in ("search", "default"):
        result = runner.invoke(cli, ["sim", "--workload", str(workload), "--policy", "shoal",
                                     "--cluster", str(cluster), "--plan-mode", mode,
                                     "--json", "-"])
        assert result.exit_code == 0, result.output
        (job,) = json.loads(result.stdout)["jobs"]  # one run: the report itself
        assert job["state"] == "finished" and job["application"] == "llama-13b"
        runs[mode] = job
    # The search's plans include the default rule's, so its job is at least as fast.
    assert runs["search"]["jct_s"] <= runs["default"]["jct_s"]
    default_plan = runs["default"]["plans"][-1]["plan"]
    assert default_plan["tp"] == default_plan["pp"] == 1
    result = runner.invoke(cli, ["sim", "--workload", str(workload), "--plan-mode", "best"])
    assert result.exit_code == 2 and "plan-mode" in result.output


def test_sim_time_resolution_sets_where_epochs_end(tmp_path, pollux_data):
    workload = _eight_jobs(tmp_path, pollux_data)
    runner = CliRunner()
    base = ["sim", "--workload", str(workload), "--policy", "tiresias",
            "--profiles", str(pollux_data / "traces"), "--json", "-"]
    finish = {}
    for resolution in ("1", "0"):
        result = runner.invoke(cli, [*base, "--time-resolution", resolution])
        assert result.exit_code == 0, result.output
        jobs = json.loads(result.stdout)["jobs"]
        finish[resolution] = [j["finish_s"] for j in jobs]
    assert all(float(t).is_integer() for t in finish["1"])  # whole seconds, as in Pollux
    assert not all(float(t).is_integer() for t in finish["0"])
    assert finish["0"] == [pytest.approx(t, abs=30) for t in finish["1"]]
    result = runner.invoke(cli, [*base, "--time-resolution", "-1"])
    assert result.exit_code == 2 and "time-resolution" in result.output
