"""The values that flow between the scheduler core, policies and backends."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from shoal.perf.goodput import GoodputModel
from shoal.spec.cluster import NodeInfo
from shoal.spec.job import JobSpec


@dataclass(frozen=True, slots=True)
class Allocation:
    """Devices of one type held by a job: the node id of each replica, in rank order."""

    device_type: str
    nodes: tuple[int, ...]

    @property
    def num_replicas(self) -> int:
        return len(self.nodes)

    @property
    def num_nodes(self) -> int:
        return len(set(self.nodes))

    @property
    def placement(self) -> tuple[int, ...]:
        """Replicas per node, one entry per run of consecutive ranks on the same node."""
        counts: list[int] = []
        for i, node in enumerate(self.nodes):
            if i and node == self.nodes[i - 1]:
                counts[-1] += 1
            else:
                counts.append(1)
        return tuple(counts)

    def per_node(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for node in self.nodes:
            out[node] = out.get(node, 0) + 1
        return out


@dataclass(frozen=True, slots=True)
class Grant:
    """What a policy gives one job: a device count, optionally a type, nodes and batch size.

    ``nodes`` pins the exact placement (the policy decided *where* too); otherwise the
    placement step chooses. ``batch_size`` fixes the global batch size; ``None`` lets the job
    adapt it within its bounds.
    """

    replicas: int
    device_type: str | None = None
    nodes: tuple[int, ...] | None = None
    batch_size: int | None = None


Decision = dict[str, Grant]


class JobState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    RESTARTING = "restarting"
    FINISHED = "finished"
    FAILED = "failed"


TERMINAL_STATES = frozenset({JobState.FINISHED, JobState.FAILED})


@dataclass(frozen=True, slots=True)
class ModelHints:
    """What a running job has learned about itself and reports to the scheduler."""

    goodput: Mapping[str, GoodputModel] = field(default_factory=dict)  # per device type
    max_profiled_replicas: Mapping[str, int] = field(default_factory=dict)
    epoch: int = 0
    progress: float = 0.0  # fraction of the job done, 0..1


class Oracle(Protocol):
    """Ground truth a simulator can offer to oracle policies (Optimus)."""

    def remaining_iterations(self, batch_size: int) -> float: ...

    def step_time(self, num_replicas: int, batch_size: int) -> float: ...


@dataclass(frozen=True, slots=True)
class JobView:
    """Read-only picture of one active job, as a policy sees it."""

    name: str
    spec: JobSpec
    state: JobState
    submit_time: float
    age: float
    attained_service: float  # device-seconds
    num_restarts: int
    allocation: Allocation | None
    hints: ModelHints
    limits: JobLimits
    oracle: Oracle | None = None
    # Seconds one restart of this job costs it (stop, checkpoint, restore, first step), as its
    # backend measured or models it; None until known.
    restart_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class JobLimits:
    """Bounds of a job that come from its application (batch sizes) and its spec."""

    init_batch_size: int
    max_batch_size: int
    min_local_bsz: int
    max_local_bsz: int
    max_replicas: int
    fixed_batch: int | None = None


@dataclass(frozen=True, slots=True)
class ClusterState:
    nodes: tuple[NodeInfo, ...]

    @property
    def device_types(self) -> list[str]:
        return list(dict.fromkeys(n.device_type for n in self.nodes))

    def capacity(self, device_type: str | None = None) -> int:
        return sum(n.capacity for n in self.nodes if device_type in (None, n.device_type))

    def nodes_of(self, device_type: str) -> list[NodeInfo]:
        return [n for n in self.nodes if n.device_type == device_type]

    def largest_node(self, device_type: str) -> int:
        """Devices on the largest node of ``device_type``."""
        return max(n.capacity for n in self.nodes_of(device_type))


class Policy(Protocol):
    """Decides what each active job gets. No I/O; may keep its own bookkeeping across rounds."""

    name: str
    adapts_batch_size: bool
    # True when the policy wants a decision as soon as a job arrives, not only every round
    # (cheap policies; periodic ones keep the round interval of their papers).
    decides_on_arrival: bool
    # True when it also wants a decision as soon as a job finishes, so its devices do not
    # stay idle until the next round.
    decides_on_completion: bool

    def decide(self, jobs: Sequence[JobView], cluster: ClusterState, now: float) -> Decision: ...


@dataclass(frozen=True, slots=True)
class JobStatus:
    """A backend's report on one job."""

    name: str
    device_seconds: float = 0.0
    finished_at: float | None = None
    failed_reason: str | None = None
    hints: ModelHints | None = None
    batch_size: int | None = None
    restart_seconds: float | None = None  # what one restart costs the job (see JobView)
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Change:
    """One action for a backend: run ``job`` on ``allocation`` (None stops it)."""

    job: str
    allocation: Allocation | None
    batch_size: int | None = None


class Backend(Protocol):
    def now(self) -> float: ...

    def cluster(self) -> ClusterState: ...

    def observe(self) -> list[JobStatus]: ...

    def apply(self, changes: Sequence[Change]) -> None: ...
