"""Fixed-size baselines on a mixed cluster: a job larger than every device type."""

from shoal.core.types import ClusterState, JobLimits, JobState, JobView, ModelHints
from shoal.policy.fifo import FifoPolicy
from shoal.policy.fixed_size import fitted_size
from shoal.policy.gavel import GavelPolicy
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
