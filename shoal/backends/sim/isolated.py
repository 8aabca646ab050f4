"""A job's completion time alone on its fair share of the cluster (finish-time fairness)."""

from __future__ import annotations

import math
from dataclasses import replace

from shoal.backends.sim.job import SimJob
from shoal.backends.sim.profile import ApplicationProfile
from shoal.core.types import Allocation, JobLimits


def isolated_jct(
    app: ApplicationProfile,
    limits: JobLimits,
    batch_size: int,
    devices: int,
    per_node: int,
    device_type: str,
    restart_delay: float,
    epochs: int | None = None,
    step: float = 3600.0,
    time_resolution: float = 1.0,
) -> float:
    """Seconds to train alone on ``devices`` devices (packed onto nodes), at ``batch_size``.

    The job starts once (one restart delay) and keeps its user batch size, so this baseline
    needs no model fitting. A share smaller than one device is rounded up to one.
    """
    devices = max(1, min(devices, limits.max_replicas, batch_size // limits.min_local_bsz or 1))
    while True:
        try:
            return _run_alone(app, limits, batch_size, devices, per_node, device_type,
                              restart_delay, epochs, step, time_resolution)
        except ValueError:
            # A share larger than the profile covers (e.g. 1/n of a big cluster): the
            # baseline is the largest share the profile can simulate.
            if devices == 1:
                raise
            devices -= 1


def _run_alone(app: ApplicationProfile, limits: JobLimits, batch_size: int, devices: int,
               per_node: int, device_type: str, restart_delay: float, epochs: int | None,
               step: float, time_resolution: float) -> float:
    nodes: list[int] = []
    for node in range(math.ceil(devices / per_node)):
        nodes.extend([node] * min(per_node, devices - len(nodes)))
    fixed = replace(limits, fixed_batch=batch_size)
    job = SimJob("isolated", app, fixed, 0.0, restart_delay, epochs,
                 time_resolution=time_resolution)
    job.reallocate(Allocation(device_type, tuple(nodes)), batch_size)
    now = 0.0
    while job.finished_at is None:
        job.advance(now, step)
        now += step
    return job.finished_at
