"""The discrete-event engine: dispatch, dynamic batching, SLO-aware admission, pipelines.

A *group* is a set of devices that runs its hosted models as a pipeline of ``stages`` FIFO
servers. A batch of one model's requests enters stage 0 when stage 0 is free and flows through
the stages in order; since batches cannot overtake each other, the time a batch spends in every
stage is fixed the moment it starts, so the only events are arrivals, "stage 0 may be free"
wake-ups and batching time-outs.

Dynamic batching: when stage 0 is free the group serves the model whose oldest queued request
is oldest, taking up to ``max_batch`` of its requests; a batch smaller than ``max_batch`` waits
until its oldest request has waited ``max_wait_s``. SLO-aware admission: a request is rejected on
arrival when no hosting group could finish it by its deadline even if it were served next, and at
batch start every request whose deadline would be missed is dropped from the batch (the batch is
re-timed without it), so capacity is never spent on a request that will miss.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from shoal.serve.profiles import BatchLatency
from shoal.serve.sim.workload import Workload

NOT_DONE = math.inf


@dataclass
class SimGroup:
    """Runtime state of one device group."""

    name: str
    devices: int
    stages: int
    latency: dict[int, BatchLatency]
    ready_at: dict[int, float]
    device_ids: tuple[int, ...] = ()
    started_at: float = 0.0
    retired_at: float = math.inf
    queues: dict[int, deque[int]] = field(default_factory=dict)
    stage_free: list[float] = field(default_factory=list)
    queued_work: float = 0.0
    in_flight: int = 0
    busy_s: float = 0.0
    wakes: set[float] = field(default_factory=set)
    # Per-model list over all requests: stage time of that request served alone (lazily filled
    # when absent; placement search passes cached lists shared by groups of the same shape).
    alone: dict[int, list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.queues = {m: deque() for m in self.latency}
        self.stage_free = [self.started_at] * self.stages

    @property
    def active(self) -> bool:
        return math.isinf(self.retired_at)

    def queued(self) -> int:
        return sum(len(q) for q in self.queues.values())


@dataclass(frozen=True)
class BatchingConfig:
    max_batch: int = 1
    max_wait_s: float = 0.0
    admission: bool = True


@dataclass
class SimResult:
    """Per-request outcome: ``finish_s`` is inf for rejected requests."""

    workload: Workload
    deadline_s: np.ndarray
    finish_s: np.ndarray
    device_seconds: float
    peak_devices: int
    groups: list[SimGroup]
    batch_sizes: list[int]


def alone_times(latency: BatchLatency, models: Sequence[int], model: int) -> list[float]:
    """Stage time of each request of ``model`` served alone (0 for other models' requests)."""
    return [latency((r,)) if m == model else 0.0 for r, m in enumerate(models)]


Controller = Callable[[float, "Engine"], None]


class Engine:
    """One simulation run over a fixed workload; groups may be added or retired while it runs
    (re-placement, autoscaling) through a controller called every ``control_interval_s``."""

    def __init__(self, workload: Workload, deadline_s: np.ndarray, batching: BatchingConfig,
                 controller: Controller | None = None, control_interval_s: float = 1.0):
        self.workload = workload
        self.arrival = workload.arrival_s.tolist()
        self.model = workload.model.tolist()
        self.deadline = np.asarray(deadline_s, dtype=float).tolist()
        self.batching = batching
        self.controller = controller
        self.control_interval_s = control_interval_s
        self.finish = [NOT_DONE] * len(workload)
        self.groups: list[SimGroup] = []
        self.hosts: dict[int, list[SimGroup]] = {}
        self.batch_sizes: list[int] = []
        self.now = 0.0
        self._events: list[tuple[float, int, int, int]] = []  # (time, seq, kind, group index)
        self._seq = 0
        self._device_log: list[tuple[float, int, SimGroup]] = []
        self._by_id: dict[int, SimGroup] = {}
        self._completions: list[tuple[float, int, int]] = []  # (finish, group id, batch size)

    # ---- groups -------------------------------------------------------------------------
    def add_group(self, group: SimGroup) -> SimGroup:
        for m, latency in group.latency.items():
            if m not in group.alone:
                group.alone[m] = alone_times(latency, self.model, m)
        group.started_at = max(group.started_at, self.now)
        group.stage_free = [group.started_at] * group.stages
        self.groups.append(group)
        self._by_id[id(group)] = group
        for m in group.latency:
            self.hosts.setdefault(m, []).append(group)
        self._device_log.append((group.started_at if group.device_ids else self.now, 1, group))
        return group

    def retire_group(self, group: SimGroup) -> None:
        """Stop dispatching to ``group``; it finishes its queue, then its devices are free."""
        if not group.active:
            return
        group.retired_at = self.now
        for m in group.latency:
            self.hosts[m].remove(group)
        self._device_log.append((self._drain_time(group), -1, group))

    def _drain_time(self, group: SimGroup) -> float:
        # Queued requests are still served; approximate the release time by the queued work.
        return max(self.now, group.stage_free[-1]) + group.queued_work

    def active_groups(self) -> list[SimGroup]:
        return [g for g in self.groups if g.active]

    def ongoing(self, group: SimGroup) -> int:
        return group.queued() + group.in_flight

    # ---- events -------------------------------------------------------------------------
    def _push(self, time: float, kind: int, gi: int) -> None:
        self._seq += 1
        heapq.heappush(self._events, (time, self._seq, kind, gi))

    def run(self) -> SimResult:
        arrival = self.arrival
        n = len(arrival)
        next_control = 0.0 if self.controller else math.inf
        completions = self._completions
        i = 0
        while True:
            t_arrival = arrival[i] if i < n else math.inf
            t_event = self._events[0][0] if self._events else math.inf
            t_done = completions[0][0] if completions else math.inf
            t = min(t_arrival, t_event, next_control, t_done)
            if math.isinf(t):
                break
            if i >= n and not self._events and not completions:
                break
            self.now = t
            if t == t_done:
                _, gid, size = heapq.heappop(completions)
                self._by_id[gid].in_flight -= size
            elif t == next_control:
                assert self.controller is not None
                self.controller(t, self)
                next_control = t + self.control_interval_s if i < n else math.inf
            elif t == t_event:
                _, _, _, gid = heapq.heappop(self._events)
                group = self._by_id[gid]
                group.wakes.discard(t)
                self._try_launch(group)
            else:
                self._on_arrival(i)
                i += 1
        device_seconds, peak = self._device_usage()
        return SimResult(self.workload, np.asarray(self.deadline), np.asarray(self.finish),
                         device_seconds, peak, self.groups, self.batch_sizes)

    def _device_usage(self) -> tuple[float, int]:
        """(device-seconds, peak devices in use); a device counts once however many groups on
        it overlap (a retiring and a replacing group on the same device)."""
        end = max([self.now, *(g.stage_free[-1] for g in self.groups)])
        log = sorted(self._device_log, key=lambda e: (e[0], e[1]))
        holders: dict[object, int] = {}
        used = peak = 0
        area = last = 0.0
        for time, delta, group in log:
            time = min(time, end)
            area += used * (time - last)
            last = time
            for device in group.device_ids or [("anon", id(group), k)
                                               for k in range(group.devices)]:
                before = holders.get(device, 0)
                holders[device] = before + delta
                used += (holders[device] > 0) - (before > 0)
            peak = max(peak, used)
        area += used * (end - last)
        return area, peak

    # ---- dispatch -----------------------------------------------------------------------
    def _on_arrival(self, r: int) -> None:
        m = self.model[r]
        now = self.now
        best: SimGroup | None = None
        best_finish = math.inf
        for group in self.hosts.get(m, ()):
            alone = group.alone[m][r]
            start = max(now, group.stage_free[0], group.ready_at[m])
            finish = start + group.queued_work + alone * group.stages
            if finish < best_finish:
                best_finish = finish
                best = group
        if best is None:
            return  # no replica of this model: counted as a miss
        if self.batching.admission:
            start = max(now, best.stage_free[0], best.ready_at[m])
            if start + best.alone[m][r] * best.stages > self.deadline[r]:
                return
        best.queues[m].append(r)
        best.queued_work += best.alone[m][r]
        self._try_launch(best)

    # ---- batching -----------------------------------------------------------------------
    def _try_launch(self, group: SimGroup) -> None:
        now = self.now
        if group.stage_free[0] > now:
            self._wake_at(group, group.stage_free[0])
            return
        cfg = self.batching
        while True:
            model, head = self._oldest_head(group, now)
            if model < 0:
                if head < math.inf:
                    self._wake_at(group, head)
                return
            queue = group.queues[model]
            lat = group.latency[model]
            if cfg.admission:
                alone = group.alone[model]
                while queue and now + alone[queue[0]] * group.stages > self.deadline[queue[0]]:
                    group.queued_work -= alone[queue.popleft()]
                if not queue:
                    continue
            oldest = self.arrival[queue[0]]
            if len(queue) < cfg.max_batch and now < oldest + cfg.max_wait_s:
                self._wake_at(group, oldest + cfg.max_wait_s)
                return
            batch = [queue.popleft() for _ in range(min(cfg.max_batch, len(queue)))]
            alone = group.alone[model]
            for r in batch:
                group.queued_work -= alone[r]
            stage_time = lat(batch)
            if cfg.admission:
                while batch:
                    done = now + stage_time * group.stages
                    keep = [r for r in batch if self.deadline[r] >= done]
                    if len(keep) == len(batch):
                        break
                    batch = keep
                    stage_time = lat(batch) if batch else 0.0
                if not batch:
                    continue
            self._launch(group, batch, stage_time)
            self._wake_at(group, group.stage_free[0])
            return

    def _oldest_head(self, group: SimGroup, now: float) -> tuple[int, float]:
        """(model whose head request is oldest among ready models, -1 if none; earliest time a
        not-yet-ready model with queued requests becomes ready)."""
        best_model = -1
        best_arrival = math.inf
        next_ready = math.inf
        for m, queue in group.queues.items():
            if not queue:
                continue
            if group.ready_at[m] > now:
                next_ready = min(next_ready, group.ready_at[m])
                continue
            a = self.arrival[queue[0]]
            if a < best_arrival:
                best_arrival = a
                best_model = m
        return best_model, next_ready

    def _launch(self, group: SimGroup, batch: Sequence[int], stage_time: float) -> None:
        end = self.now
        for s in range(group.stages):
            end = max(end, group.stage_free[s]) + stage_time
            group.stage_free[s] = end
        for r in batch:
            self.finish[r] = end
        group.busy_s += stage_time * group.stages
        group.in_flight += len(batch)
        heapq.heappush(self._completions, (end, id(group), len(batch)))
        self.batch_sizes.append(len(batch))

    def _wake_at(self, group: SimGroup, time: float) -> None:
        if time not in group.wakes:
            group.wakes.add(time)
            self._push(time, 0, id(group))
