"""Serve and stream jobs get their demand first; the training policy shares what is left.

A service is not an elastic training job: it does not trade devices for a faster finish, it
needs a certain number of devices *now* to keep its promise, and fewer means missed requests
or a growing lag. Every round, before the training policy runs:

1. **Demand.** For each service, on each device type it has a profile for:
   - ``serve``: the replicas that keep the latency SLO at the current arrival rate
     (:meth:`~shoal.spec.serving.ServeSpec.replicas_for`: the largest batch ``b`` with
     ``2 L(b) <= SLO`` gives a replica ``b / L(b)`` requests/s; replicas =
     ``ceil(rate / (capacity x target_utilization))``);
   - ``stream``: the fewest devices whose capacity covers ``headroom`` x the input rate plus
     draining the backlog within half the lag bound
     (:meth:`~shoal.spec.serving.StreamSpec.devices_for`). A device's capacity is the speed
     the backend measured for one device of that type (``device_speed`` and ``device_type``
     in the status: samples per busy worker-second) once there is one, else the declared
     ``throughput``: a device slower than declared gets the job more devices at once, rather
     than after a backlog has piled up (and fewer again once it has drained).
   The rate is the one the backend measured over its last interval (``arrival_rate`` /
   ``input_rate`` and ``backlog`` in the job's status), or the declared rate before the first
   measurement. Demand goes up at once and down only after it has stayed lower for the job's
   ``downscale_delay_s``.
2. **Device type.** The current type when the demand fits there, else the type that needs the
   fewest devices among those where it fits, else the type where most of it fits.
3. **Devices.** Services keep the devices they hold (shrinking drops replicas from the nodes
   where they have the fewest), then grow onto free devices (best fit, so whole nodes stay
   free for training), then onto devices of training jobs: the smallest training job that
   frees enough, else the largest, until the demand is met. Displaced training jobs lose
   their allocation and are placed again by the policy.
4. **The rest.** The training policy decides over the training jobs only, on the cluster with
   the services' devices removed. Earlier-submitted services are served first when the
   cluster cannot hold every demand.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from shoal.core.types import Allocation, ClusterState, Decision, Grant, JobStatus, JobView
from shoal.spec.cluster import NodeInfo
from shoal.spec.job import JobSpec


def is_service(spec: JobSpec) -> bool:
    return spec.kind != "train"


def service_device_types(spec: JobSpec, cluster: ClusterState) -> list[str]:
    """Device types of ``cluster`` a service has a profile for and is allowed on."""
    section = spec.serve if spec.kind == "serve" else spec.stream
    profiled = section.device_types if section is not None else []
    allowed = spec.device_types
    return [t for t in cluster.device_types if t in profiled and (not allowed or t in allowed)]


@dataclass
class ServicePlan:
    """One round's service grants and what the training policy gets to decide over."""

    grants: Decision
    training: list[JobView]
    cluster: ClusterState
    displaced: frozenset[str] = frozenset()
    demand: dict[str, tuple[str, int]] = field(default_factory=dict)  # name -> (type, devices)


@dataclass
class _Measured:
    rate: float | None = None
    backlog: float = 0.0
    below_since: float | None = None
    per_device: dict[str, float] = field(default_factory=dict)  # device type -> samples/s


class ServiceDemand:
    """Tracks what services measured and turns it into devices, round by round."""

    def __init__(self) -> None:
        self._measured: dict[str, _Measured] = {}
        self.last: ServicePlan | None = None

    # ----- observation -----
    def observe(self, spec: JobSpec, status: JobStatus) -> None:
        if not is_service(spec):
            return
        measured = self._measured.setdefault(spec.name, _Measured())
        key = "arrival_rate" if spec.kind == "serve" else "input_rate"
        rate = status.extra.get(key)
        if rate is not None:
            measured.rate = float(rate)
        measured.backlog = float(status.extra.get("backlog", 0.0) or 0.0)
        speed, dtype = status.extra.get("device_speed"), status.extra.get("device_type")
        if speed is not None and dtype is not None and float(speed) > 0:
            measured.per_device[str(dtype)] = float(speed)

    def rate(self, view: JobView, now: float) -> float:
        """The measured rate, or the declared one before the first measurement."""
        measured = self._measured.get(view.name)
        if measured is not None and measured.rate is not None:
            return measured.rate
        age = max(0.0, now - view.submit_time)
        spec = view.spec
        if spec.kind == "serve" and spec.serve is not None and spec.serve.arrival is not None:
            return spec.serve.arrival.rate_at(age) or 0.0
        if spec.kind == "stream" and spec.stream is not None:
            return spec.stream.rate_at(age)
        return 0.0

    def demand(self, view: JobView, device_type: str, now: float) -> int | None:
        """Devices of ``device_type`` the service needs now; None if the type cannot serve it."""
        spec = view.spec
        rate = self.rate(view, now)
        if spec.kind == "serve" and spec.serve is not None:
            return spec.serve.replicas_for(device_type, rate)
        if spec.kind == "stream" and spec.stream is not None:
            measured = self._measured.get(view.name, _Measured())
            return spec.stream.devices_for(device_type, rate, measured.backlog,
                                           measured.per_device.get(device_type))
        return None

    def _downscale_delay(self, spec: JobSpec) -> float:
        section = spec.serve if spec.kind == "serve" else spec.stream
        return section.downscale_delay_s if section is not None else 0.0

    # ----- the plan -----
    def plan(self, views: Sequence[JobView], cluster: ClusterState, now: float) -> ServicePlan:
        services = sorted((v for v in views if is_service(v.spec)),
                          key=lambda v: (v.submit_time, v.name))
        training = [v for v in views if not is_service(v.spec)]
        if not services:
            self.last = ServicePlan({}, training, cluster)
            return self.last
        type_of = {n.node_id: n.device_type for n in cluster.nodes}
        capacity = {n.node_id: n.capacity for n in cluster.nodes}
        targets = self._targets(services, cluster, now)

        reserved = dict.fromkeys(capacity, 0)
        kept: dict[str, list[int]] = {}
        for view in services:  # pass 1: keep what services hold, up to their new demand
            dtype, want = targets[view.name]
            old = view.allocation
            nodes: list[int] = []
            if old is not None and old.device_type == dtype and want > 0:
                nodes = _shrink(list(old.nodes), want)
            for node in nodes:
                reserved[node] += 1
            kept[view.name] = nodes

        used = _training_use(training)
        displaced: set[str] = set()
        grants: Decision = {}
        for view in services:  # pass 2: grow, free devices first, then training jobs'
            dtype, want = targets[view.name]
            nodes = kept[view.name]
            while len(nodes) < want:
                free = {n: capacity[n] - reserved[n] - used.get(n, 0) for n in capacity
                        if type_of[n] == dtype}
                open_nodes = [n for n, f in free.items() if f > 0]
                if open_nodes:
                    node = min(open_nodes, key=lambda n: (free[n], n))  # best fit
                    take = min(free[node], want - len(nodes))
                    nodes.extend([node] * take)
                    reserved[node] += take
                    continue
                victim = _victim(training, displaced, dtype, want - len(nodes))
                if victim is None:
                    break
                displaced.add(victim.name)
                assert victim.allocation is not None
                for node, count in victim.allocation.per_node().items():
                    used[node] -= count
            if nodes:
                grants[view.name] = Grant(len(nodes), dtype, tuple(nodes))

        left = tuple(NodeInfo(n.node_id, n.device_type, n.capacity - reserved[n.node_id])
                     for n in cluster.nodes if n.capacity - reserved[n.node_id] > 0)
        remaining = cluster if not any(reserved.values()) else ClusterState(left)
        training = [dataclasses.replace(v, allocation=None) if v.name in displaced else v
                    for v in training]
        self.last = ServicePlan(grants, training, remaining, frozenset(displaced), targets)
        return self.last

    def _targets(self, services: list[JobView], cluster: ClusterState,
                 now: float) -> dict[str, tuple[str, int]]:
        """(device type, devices) per service, in priority order, within the cluster."""
        available = {t: cluster.capacity(t) for t in cluster.device_types}
        out: dict[str, tuple[str, int]] = {}
        for view in services:
            wants = {}
            for dtype in service_device_types(view.spec, cluster):
                want = self.demand(view, dtype, now)
                if want is not None:
                    wants[dtype] = want
            if not wants:
                out[view.name] = ("", 0)
                continue
            old = view.allocation
            fits = [t for t, w in wants.items() if w <= available[t]]
            if old is not None and old.device_type in fits:
                dtype = old.device_type
            elif fits:
                dtype = min(fits, key=lambda t: (wants[t], -available[t]))
            else:
                dtype = max(wants, key=lambda t: (min(wants[t], available[t]), -wants[t]))
            want = self._hold_down(view, dtype, wants[dtype], now)
            want = min(want, available[dtype])
            available[dtype] -= want
            out[view.name] = (dtype, want)
        return out

    def _hold_down(self, view: JobView, dtype: str, want: int, now: float) -> int:
        """Shrink only after the lower demand has held for the job's downscale delay."""
        measured = self._measured.setdefault(view.name, _Measured())
        old = view.allocation
        have = old.num_replicas if old is not None and old.device_type == dtype else 0
        if want >= have:
            measured.below_since = None
            return want
        if measured.below_since is None:
            measured.below_since = now
        if now - measured.below_since >= self._downscale_delay(view.spec):
            measured.below_since = None
            return want
        return have

    def kept(self, views: Iterable[JobView]) -> dict[str, Allocation]:
        """Current allocations the placement may keep: all but those of displaced jobs."""
        displaced = self.last.displaced if self.last is not None else frozenset()
        return {v.name: v.allocation for v in views
                if v.allocation is not None and v.name not in displaced}

    def forget(self, name: str) -> None:
        self._measured.pop(name, None)


def _shrink(nodes: list[int], want: int) -> list[int]:
    """Keep ``want`` of ``nodes``, dropping replicas from the nodes holding fewest first."""
    nodes = list(nodes)
    while len(nodes) > want:
        counts = {n: nodes.count(n) for n in nodes}
        drop = min(counts, key=lambda n: (counts[n], -n))
        index = len(nodes) - 1 - nodes[::-1].index(drop)
        nodes.pop(index)
    return nodes


def _training_use(training: Iterable[JobView]) -> dict[int, int]:
    used: dict[int, int] = {}
    for view in training:
        if view.allocation is not None:
            for node, count in view.allocation.per_node().items():
                used[node] = used.get(node, 0) + count
    return used


def _victim(training: Sequence[JobView], displaced: set[str], dtype: str,
            shortfall: int) -> JobView | None:
    """The training job to take devices from: the smallest that frees enough, else the
    largest (ties: the most recently submitted, which has the least to lose)."""
    candidates = [v for v in training if v.allocation is not None and v.name not in displaced
                  and v.allocation.device_type == dtype]
    if not candidates:
        return None
    enough = [v for v in candidates if v.allocation and v.allocation.num_replicas >= shortfall]
    if enough:
        return min(enough, key=lambda v: (v.allocation.num_replicas if v.allocation else 0,
                                          -v.submit_time, v.name))
    return max(candidates, key=lambda v: (v.allocation.num_replicas if v.allocation else 0,
                                          v.submit_time, v.name))
