"""bench/model_error.py: the step times a job's model predicts for configurations it has not
run, against the profile's."""

from pathlib import Path

import pytest

from tests.sim.bench_scripts import load

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = ROOT.parent / "shared" / "data" / "pollux" / "workloads" / "workload-7.csv"


@pytest.mark.skipif(not WORKLOAD.exists(), reason="needs ../shared/data")
def test_first_runs_are_predicted_well_on_one_node_and_too_fast_across_nodes(tmp_path):
    head = tmp_path / "w7-12.csv"
    head.write_text("".join(WORKLOAD.read_text().splitlines(keepends=True)[:13]))
    ratios, avg_jct = load("model_error").first_run_errors(head, "hetero-64",
                                                ROOT / "data" / "profiles-hetero", "shoal")
    assert avg_jct > 0
    # One node of a type the job was profiled on: the fitted model is within 10% at the median.
    single = sorted(ratios[("cifar10", "a100", "single")])
    assert len(single) > 10 and 0.9 < single[len(single) // 2] < 1.1
    # A fixed-batch recommender (ncf, 16384 samples per micro-batch) is profiled at the batch
    # it runs, and its fit is on the batch's scale; profiled at 256 it was predicted 16x slow.
    ncf = ratios[("ncf", "t4", "single")]
    assert ncf and all(0.9 < ratio < 1.1 for ratio in ncf)
    # Across nodes, before a job has run there, the fit assumes inter-node all-reduce at 1.1x
    # the intra-node time (Pollux's prior); these profiles' networks are far slower.
    assert ratios[("bert", "a100", "multi")] and min(ratios[("bert", "a100", "multi")]) < 0.8
