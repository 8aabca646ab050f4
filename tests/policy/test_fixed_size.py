"""Fixed-size baselines on a mixed cluster: a job larger than every device type."""

from dataclasses import replace

from shoal.core.placement import place
from shoal.core.types import (
    Allocation,
    ClusterState,
    Grant,
    JobLimits,
    JobState,
    JobView,
    ModelHints,
)
from shoal.policy.fifo import FifoPolicy
from shoal.policy.fixed_size import fitted_size
from shoal.policy.gavel import GavelPolicy
from shoal.policy.optimus import OptimusPolicy
from shoal.policy.tiresias import TiresiasPolicy
from shoal.spec import JobSpec
from shoal.spec.cluster import NodeInfo

# 8 t4 on two nodes and 4 v100: no single type holds 12 devices.
MIXED = ClusterState((NodeInfo(0, "t4", 4), NodeInfo(1, "t4", 4), NodeInfo(2, "v100", 4)))


def _job(name: str, replicas: int, rigid: bool = False,
         types: list[str] | None = None) -> JobView:
    spec = JobSpec(name=name, application="synthetic", num_replicas=replicas, rigid=rigid,
                   device_types=types)
    return JobView(name=name, spec=spec, state=JobState.PENDING, submit_time=0.0, age=0.0,
                   attained_service=0.0, num_restarts=0, allocation=None, hints=ModelHints(),
                   limits=JobLimits(64, 8192, 16, 256, 64))


def test_a_job_larger_than_every_type_is_sized_to_the_largest_type_it_may_use():
    assert fitted_size(_job("big", 12), MIXED, 12) == 8
    assert fitted_size(_job("big", 12, types=["v100"]), MIXED, 12) == 4
    assert fitted_size(_job("small", 3), MIXED, 3) == 3
    # A rigid job keeps its size: it runs at that size or not at all.
    assert fitted_size(_job("rigid", 12, rigid=True), MIXED, 12) == 12


def test_fifo_and_tiresias_grant_a_placeable_size():
    for policy in (FifoPolicy(), TiresiasPolicy()):
        decision = policy.decide([_job("big", 12)], MIXED, 0.0)
        assert decision["big"].replicas == 8, policy
    assert GavelPolicy._scale(_job("big", 12), MIXED) == 8


def test_fifo_and_tiresias_count_free_devices_per_type():
    # 12 devices in all, but after a (6 t4) and b (3, on the v100s) no type has 3 free for c.
    jobs = [_job("a", 6), _job("b", 3), _job("c", 3), _job("d", 1)]
    jobs = [replace(job, submit_time=float(i)) for i, job in enumerate(jobs)]
    for policy in (FifoPolicy(), FifoPolicy(backfill=True), TiresiasPolicy()):
        decision = policy.decide(jobs, MIXED, 0.0)
        assert (decision["a"].device_type, decision["b"].device_type) == ("t4", "v100"), policy
        assert "c" not in decision, policy
        # Every grant is placed: the policy runs exactly the jobs it believes it runs.
        assert set(place(decision, MIXED, {})) == set(decision), policy
    assert "d" not in FifoPolicy().decide(jobs, MIXED, 0.0)  # behind c, in order
    assert "d" in FifoPolicy(backfill=True).decide(jobs, MIXED, 0.0)


def test_a_running_job_keeps_its_type_when_another_fits_first():
    running = replace(_job("a", 4), state=JobState.RUNNING,
                      allocation=Allocation("v100", (2, 2, 2, 2)))
    for policy in (FifoPolicy(), TiresiasPolicy()):
        decision = policy.decide([running], MIXED, 0.0)
        assert decision["a"] == Grant(4, "v100", batch_size=running.spec.batch_size), policy


def test_a_job_running_on_a_type_the_cluster_no_longer_has_does_not_break_the_count():
    gone = replace(_job("old", 2), state=JobState.RUNNING, allocation=Allocation("k80", (7, 7)))
    for policy in (FifoPolicy(), TiresiasPolicy()):
        decision = policy.decide([gone, _job("new", 4)], MIXED, 0.0)
        assert decision["new"].device_type == "t4", policy


def test_optimus_grows_each_job_within_one_type():
    # Optimus hands out all 12 devices; type-blind counting granted sizes (e.g. 5 + 4 + 3)
    # that two types of 8 and 4 cannot hold, and the largest grants went unplaced.
    jobs = [_job(name, 8) for name in ("a", "b", "c")]
    decision = OptimusPolicy().decide(jobs, MIXED, 0.0)
    assert sum(g.replicas for g in decision.values()) == 12
    for device_type in ("t4", "v100"):
        assert sum(g.replicas for g in decision.values()
                   if g.device_type == device_type) == MIXED.capacity(device_type)
    assert set(place(decision, MIXED, {})) == set(decision)
