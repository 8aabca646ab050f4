"""Streaming jobs: an input rate (samples/s) that must be kept up with; lag is the metric.

A fluid model stepped every ``dt``: the backlog grows by ``rate(t) dt`` and shrinks by the
processing capacity ``devices * per_device_rate * efficiency(devices)``. Lag is the backlog in
seconds of input (``backlog / rate``). The scaler gives the job enough devices to process
``headroom`` times its input rate plus a share to drain the backlog within ``drain_s``; new
devices start working after ``startup_s``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class StreamJob:
    per_device_rate: float  # samples/s one device processes
    alpha: float = 0.95  # capacity(k) = per_device_rate * k**alpha
    min_devices: int = 1
    max_devices: int = 64

    def capacity(self, devices: int) -> float:
        return self.per_device_rate * devices**self.alpha if devices > 0 else 0.0

    def devices_for(self, rate: float) -> int:
        k = self.min_devices
        while k < self.max_devices and self.capacity(k) < rate:
            k += 1
        return k


@dataclass(frozen=True)
class StreamScaler:
    headroom: float = 1.2
    drain_s: float = 30.0
    startup_s: float = 5.0
    interval_s: float = 5.0


@dataclass
class StreamTrace:
    time_s: list[float]
    rate: list[float]
    devices: list[int]
    lag_s: list[float]

    @property
    def max_lag_s(self) -> float:
        return max(self.lag_s)


def simulate_stream(job: StreamJob, rate: Callable[[float], float], duration_s: float,
                    initial_devices: int, scaler: StreamScaler | None, dt: float = 0.5
                    ) -> StreamTrace:
    """Step the stream job; ``scaler=None`` keeps ``initial_devices`` fixed."""
    devices = initial_devices
    pending: list[tuple[float, int]] = []  # (time effective, device count)
    backlog = 0.0
    next_decision = 0.0
    out = StreamTrace([], [], [], [])
    steps = math.ceil(duration_s / dt)
    for step in range(steps):
        now = step * dt
        while pending and pending[0][0] <= now:
            devices = pending.pop(0)[1]
        r = rate(now)
        if scaler is not None and now >= next_decision:
            need = r * scaler.headroom + backlog / scaler.drain_s
            target = job.devices_for(need)
            planned = pending[-1][1] if pending else devices
            if target > planned:
                pending.append((now + scaler.startup_s, target))
            elif target < planned and not pending:
                devices = target  # shrinking is immediate
            next_decision = now + scaler.interval_s
        backlog = max(0.0, backlog + (r - job.capacity(devices)) * dt)
        out.time_s.append(now)
        out.rate.append(r)
        out.devices.append(devices)
        out.lag_s.append(backlog / r if r > 0 else 0.0)
    return out
