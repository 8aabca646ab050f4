"""The scheduler core: job state, the round loop, placement."""

from shoal.core.placement import place
from shoal.core.scheduler import RoundStats, Scheduler
from shoal.core.types import (
    Allocation,
    Backend,
    Change,
    ClusterState,
    Decision,
    Grant,
    JobLimits,
    JobState,
    JobStatus,
    JobView,
    ModelHints,
    Policy,
)

__all__ = [
    "Allocation",
    "Backend",
    "Change",
    "ClusterState",
    "Decision",
    "Grant",
    "JobLimits",
    "JobState",
    "JobStatus",
    "JobView",
    "ModelHints",
    "Policy",
    "RoundStats",
    "Scheduler",
    "place",
]
