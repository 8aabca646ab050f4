"""Job records and their state machine."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from shoal.core.types import (
    TERMINAL_STATES,
    Allocation,
    JobLimits,
    JobState,
    ModelHints,
)
from shoal.spec.job import JobSpec

ALLOWED = {
    JobState.PENDING: {JobState.RESTARTING, JobState.FAILED, JobState.FINISHED},
    JobState.RESTARTING: {
        JobState.RUNNING, JobState.PENDING, JobState.RESTARTING, JobState.FINISHED,
        JobState.FAILED,
    },
    JobState.RUNNING: {
        JobState.RESTARTING, JobState.PENDING, JobState.FINISHED, JobState.FAILED,
    },
    JobState.FINISHED: set(),
    JobState.FAILED: set(),
}


class IllegalTransition(RuntimeError):
    pass


@dataclass
class Event:
    time: float
    job: str
    kind: str
    detail: str = ""


@dataclass
class JobRecord:
    spec: JobSpec
    state: JobState = JobState.PENDING
    limits: JobLimits | None = None
    allocation: Allocation | None = None
    batch_size: int | None = None
    start_time: float | None = None
    finish_time: float | None = None
    failure: str | None = None
    num_starts: int = 0
    device_seconds: float = 0.0
    profiling_seconds: float = 0.0
    restart_seconds: float | None = None  # measured cost of one restart, once known
    hints: ModelHints = field(default_factory=ModelHints)
    history: list[tuple[float, Allocation | None]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def num_restarts(self) -> int:
        return max(self.num_starts - 1, 0)

    @property
    def active(self) -> bool:
        return self.state not in TERMINAL_STATES

    def queued_seconds(self, until: float | None = None) -> float | None:
        """Seconds since submission in which the job held no devices (before its first start
        and while preempted), up to its finish, or up to ``until`` while it has not finished;
        None when neither is known."""
        end = self.finish_time if self.finish_time is not None else until
        if end is None:
            return None
        held = 0.0
        for (since, allocation), (stop, _) in itertools.pairwise([*self.history, (end, None)]):
            if allocation is not None:
                held += max(min(stop, end) - since, 0.0)
        return max(end - self.spec.submit_time - held, 0.0)

    def transition(self, new: JobState, now: float, events: list[Event], detail: str = ""):
        if new == self.state and new != JobState.RESTARTING:
            return
        if new not in ALLOWED[self.state]:
            raise IllegalTransition(f"{self.name}: {self.state} -> {new}")
        events.append(Event(now, self.name, str(new), detail))
        self.state = new
