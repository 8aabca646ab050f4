"""Jobs that declare their model: spec checks, plan-aware policies and the simulator."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shoal.backends.sim.aliases import AliasedProfiles
from shoal.backends.sim.backend import SimBackend
from shoal.backends.sim.planned import PlannedSimJob, min_feasible_replicas
from shoal.backends.sim.profile import ProfileLibrary
from shoal.backends.sim.run import simulate
from shoal.core.scheduler import Scheduler
from shoal.core.types import JobState
from shoal.metrics.report import summarize
from shoal.perf.catalog import parse_model
from shoal.perf.parallel import best_plan
from shoal.perf.planned import PlannedGoodput
from shoal.policy import make_policy
from shoal.spec import JobSpec, parse_cluster
from shoal.spec.errors import SpecError
from shoal.spec.job import load_job_yaml, parse_job

ROOT = Path(__file__).resolve().parents[2]
A100 = {"peak_tflops": 312, "intra_node_gbps": 300, "inter_node_gbps": 25}
MIXED = parse_cluster({
    "name": "a100-mix-32",
    "device_types": [{"name": "a100-80g", "memory_gb": 80, **A100},
                     {"name": "a100-40g", "memory_gb": 40, **A100}],
    "nodes": [{"device_type": "a100-80g", "devices_per_node": 8, "count": 2},
              {"device_type": "a100-40g", "devices_per_node": 8, "count": 2}],
})
ONE_NODE_80G = parse_cluster({
    "name": "one-node",
    "device_types": [{"name": "a100-80g", "memory_gb": 80, **A100}],
    "nodes": [{"device_type": "a100-80g", "devices_per_node": 8, "count": 1}],
})
SEVENTY_B = "llama-2-70b"


@pytest.fixture(scope="module")
def a100_profiles() -> AliasedProfiles:
    """The A100 profiles of the Pollux applications, serving both memory sizes."""
    library = ProfileLibrary(ROOT / "data" / "profiles-hetero")
    return AliasedProfiles(library, {"a100-80g": "a100", "a100-40g": "a100"})


def llm(name: str, model: str, tokens: int, submit: float = 0.0, **extra) -> JobSpec:
    return JobSpec(name=name, model=model, batch_size=64, target_tokens=tokens,
                   submit_time=submit, **extra)


def mixed_workload() -> list[JobSpec]:
    return [
        JobSpec(name="cifar", application="cifar10", batch_size=128),
        JobSpec(name="bert", application="bert", batch_size=12, submit_time=100,
                target_epochs=1),
        llm("gpt-small", "gpt-1.3b", 20_000_000),
        llm("llama7", "llama-7b", 10_000_000, submit=50),
        llm("llama70", SEVENTY_B, 2_000_000, submit=200),
    ]


# ---------------------------------------------------------------- the spec


@pytest.mark.parametrize(("fields", "where"), [
    ({"model": "llama-7b", "target_tokens": 10**9}, "batch_size"),
    ({"model": "llama-7b", "batch_size": 64}, "target_tokens"),
    ({"model": "llama-7b", "batch_size": 64, "target_tokens": 0}, "target_tokens"),
    ({"model": "llama-8x", "batch_size": 64, "target_tokens": 10**9}, "model"),
    ({"model": "", "batch_size": 64, "target_tokens": 10**9}, "model"),
    ({"model": "gpt:layers=2,hidden=64", "batch_size": 64, "target_tokens": 10**9}, "model"),
    ({"model": "llama-7b:heads=5", "batch_size": 64, "target_tokens": 10**9}, "model.heads"),
    ({"model": "llama-7b:seq=long", "batch_size": 64, "target_tokens": 10**9}, "model.seq"),
    ({"model": "llama-7b", "batch_size": 64, "target_tokens": 10**9, "target_epochs": 2},
     "target_epochs"),
    ({"application": "cifar10", "target_tokens": 10**9}, "target_tokens"),
])
def test_spec_errors_name_the_field(fields, where):
    with pytest.raises(SpecError) as info:
        parse_job({"name": "job", **fields})
    assert info.value.field == where
    assert f"field '{where}'" in str(info.value)


def test_model_job_from_yaml():
    spec = load_job_yaml("name: ft\nmodel: llama-7b:seq=4096\nbatch_size: 128\n"
                         "target_tokens: 50000000\n")
    assert spec.application == "llama-7b:seq=4096"  # the model stands in for a profile
    assert parse_model(spec.model).seq == 4096
    assert parse_model("gpt:layers=2,hidden=64,heads=4,seq=32,vocab=100").layers == 2


def test_admission_rejects_what_fits_nowhere(a100_profiles):
    tiny = parse_cluster({
        "name": "tiny", "device_types": [{"name": "a100-40g", "memory_gb": 40, **A100}],
        "nodes": [{"device_type": "a100-40g", "devices_per_node": 2, "count": 1}]})
    with pytest.raises(SpecError) as info:
        SimBackend(tiny, a100_profiles).admit(llm("big", SEVENTY_B, 10**6))
    assert info.value.field == "model" and "fits" in str(info.value)
    backend = SimBackend(MIXED, a100_profiles)
    with pytest.raises(SpecError) as info:
        backend.admit(llm("capped", SEVENTY_B, 10**6, max_replicas=2))
    assert info.value.field == "max_replicas"
    with pytest.raises(SpecError) as info:
        backend.admit(llm("rigid", SEVENTY_B, 10**6, rigid=True, num_replicas=2))
    assert info.value.field == "num_replicas"
    with pytest.raises(SpecError) as info:
        backend.admit(llm("typed", "gpt-1.3b", 10**6, device_types=["h100-80g"]))
    assert info.value.field == "device_types"
    # Through the scheduler, a rejected job fails at once with the reason.
    result = simulate([llm("big", SEVENTY_B, 10**6)], make_policy("shoal"), tiny, a100_profiles)
    (record,) = result.records
    assert record.state == JobState.FAILED and "field 'model'" in record.failure


# ---------------------------------------------------------------- the goodput the policy sees


def test_goodput_is_the_best_plans_throughput_and_zero_where_none_fits():
    model = parse_model(SEVENTY_B)
    device = MIXED.device_type("a100-40g")
    search = PlannedGoodput(model, device, 8, 64, "search")
    default = PlannedGoodput(model, device, 8, 64, "default")
    nodes, replicas = np.array([1, 1, 1, 1, 2, 4]), np.array([1, 2, 4, 8, 16, 32])
    goodput = search.optimize(nodes, replicas).goodput
    assert list(goodput[:3]) == [0.0, 0.0, 0.0]  # 140 GB of weights do not fit 1-4 x 40 GB
    assert all(goodput[3:] > 0)
    for n, r, g in zip(nodes, replicas, goodput, strict=True):
        plan = best_plan(model, device, int(r), min(int(r), 8) if n == 1 else 8, 64)
        assert g == (plan.throughput if plan else 0.0)
    # The fixed default plan is one of the plans the search considers: never faster.
    fixed = default.optimize(nodes, replicas).goodput
    assert np.all(fixed <= goodput) and fixed[3] == 0.0  # ZeRO-3 alone does not fit 8 x 40 GB
    assert search.min_replicas([1, 2, 4, 8, 16]) == 8
    # A spread over nodes is planned for its smallest share of a node: tensor-parallel groups
    # of 2 devices per node are slower than groups of 4.
    assert search.plan_on([8, 8]) is search.plan(2, 16)
    thin = search.plan_on([2] * 8)
    assert thin.config.tp <= 2 and thin.throughput < search.plan(2, 16).throughput


@pytest.mark.parametrize("policy", ["shoal", "sia", "pollux"])
def test_policy_never_grants_an_allocation_no_plan_fits(policy, a100_profiles):
    """Seven jobs share 8 x 80 GB: a fair share is one device, on which 70B does not fit."""
    backend = SimBackend(ONE_NODE_80G, a100_profiles)
    scheduler = Scheduler(make_policy(policy), backend)
    scheduler.submit(llm("llama70", SEVENTY_B, 10**6))
    for i in range(6):
        scheduler.submit(llm(f"small-{i}", "gpt-1.3b", 10**6))
    big = backend.jobs["llama70"]
    assert isinstance(big, PlannedSimJob)
    assert min_feasible_replicas(big) == {"a100-80g": 4}
    granted = []
    for _ in range(5):
        scheduler.round()
        backend.advance(60)
        alloc = scheduler.records["llama70"].allocation
        if alloc is not None:
            granted.append(alloc.num_replicas)
            assert big.plan_for(alloc) is not None
    assert granted, "the 70B job never ran"  # it runs once the small jobs leave room
    assert all(count >= 4 for count in granted)
    assert all(r.state != JobState.FAILED for r in scheduler.records.values())


# ---------------------------------------------------------------- the simulator


def _check_plans(result, mode: str) -> None:
    for name, history in result.plans.items():
        assert history, f"{name} ran without a recorded plan"
        job_min = None
        for entry in history:
            plan = entry["plan"]
            assert plan is not None, f"{name} was given {entry} where no plan fits"
            assert plan["dp"] * plan["tp"] * plan["pp"] == entry["replicas"]
            assert plan["memory_gib"] <= (80 if entry["device_type"] == "a100-80g" else 40)
            if mode == "default":  # pure data parallel, else ZeRO-3: no model parallelism
                assert (plan["tp"], plan["pp"], plan["offload"]) == (1, 1, False)
                assert plan["zero_stage"] in (0, 3)
            job_min = min(job_min or entry["replicas"], entry["replicas"])
        assert job_min >= 1


@pytest.mark.parametrize(("policy", "mode"), [
    ("shoal", "search"), ("shoal", "default"), ("pollux", "search"), ("pollux", "default"),
    ("sia", "search"),
])
def test_mixed_workload_finishes(policy, mode, a100_profiles):
    result = simulate(mixed_workload(), make_policy(policy), MIXED, a100_profiles,
                      plan_mode=mode)
    report = summarize(result)
    assert report["summary"]["finished"] == 5, [j["failure"] for j in report["jobs"]]
    assert set(result.plans) == {"gpt-small", "llama7", "llama70"}
    _check_plans(result, mode)
    big = result.plans["llama70"]
    # The 70B job got the devices to fit each time (4 x 80 GB or 8 x 40 GB at least).
    assert all(e["replicas"] >= (4 if e["device_type"] == "a100-80g" else 8) for e in big)
    rows = {j["name"]: j for j in report["jobs"]}
    assert rows["llama70"]["isolated_jct_s"] > 0  # fairness is reported for model jobs too
    if mode == "search":
        assert any(e["plan"]["tp"] * e["plan"]["pp"] > 1 or e["plan"]["offload"] for e in big)


def test_searched_plans_finish_a_large_job_sooner_than_the_default_plan(a100_profiles):
    """Alone on the cluster, the job runs at its fastest allocation under either rule; the
    searched plan there is at least as fast as the default and here twice as fast."""
    jct = {}
    for mode in ("search", "default"):
        result = simulate([llm("llama70", SEVENTY_B, 4_000_000)], make_policy("shoal"), MIXED,
                          a100_profiles, plan_mode=mode)
        (record,) = result.records
        assert record.state == JobState.FINISHED
        jct[mode] = record.finish_time - record.spec.submit_time
        assert result.plans["llama70"][-1]["replicas"] == 16
    assert jct["search"] < 0.75 * jct["default"]
