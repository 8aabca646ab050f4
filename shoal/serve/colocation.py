"""Lending devices of elastic training jobs to serving during bursts, and the goodput it costs.

Training jobs are modelled as elastic jobs with a throughput curve ``T(k) = base * k**alpha``
(samples/s on ``k`` devices, alpha < 1 for sub-linear scaling). The lender takes a device from
the job that loses the least throughput by giving one up (never below its ``min_devices``) and
returns devices to the jobs they came from. Goodput lost is the integral over time of the
throughput the jobs would have had minus what they had.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ElasticTrainingJob:
    name: str
    devices: int
    min_devices: int = 1
    base_throughput: float = 100.0  # samples/s on one device
    alpha: float = 0.9
    lent: int = 0  # devices currently lent to serving
    history: list[tuple[float, int]] = field(default_factory=list)  # (time, devices)

    def throughput(self, devices: int) -> float:
        return self.base_throughput * devices**self.alpha if devices > 0 else 0.0

    @property
    def running_devices(self) -> int:
        return self.devices - self.lent


class TrainingLender:
    """Hands out (and takes back) devices of elastic training jobs; tracks lost throughput."""

    def __init__(self, jobs: list[ElasticTrainingJob]):
        self.jobs = jobs
        self._last = 0.0
        self.lost_samples = 0.0
        self.full_samples = 0.0
        for job in jobs:
            job.history.append((0.0, job.running_devices))

    def _advance(self, now: float) -> None:
        dt = max(0.0, now - self._last)
        for job in self.jobs:
            full = job.throughput(job.devices)
            self.full_samples += full * dt
            self.lost_samples += (full - job.throughput(job.running_devices)) * dt
        self._last = max(self._last, now)

    def borrow(self, now: float) -> ElasticTrainingJob | None:
        self._advance(now)
        candidates = [j for j in self.jobs if j.running_devices > j.min_devices]
        if not candidates:
            return None
        job = min(candidates, key=lambda j: j.throughput(j.running_devices)
                  - j.throughput(j.running_devices - 1))
        job.lent += 1
        job.history.append((now, job.running_devices))
        return job

    def give_back(self, job: ElasticTrainingJob, now: float) -> None:
        self._advance(now)
        job.lent -= 1
        job.history.append((now, job.running_devices))

    def report(self, now: float) -> dict[str, float]:
        self._advance(now)
        return {
            "training_samples_lost": self.lost_samples,
            "training_goodput_lost_fraction": (self.lost_samples / self.full_samples
                                               if self.full_samples else 0.0),
            "max_devices_lent": max((j.devices - min(k for _, k in j.history)
                                     for j in self.jobs), default=0),
            "devices_lent_at_end": sum(j.lent for j in self.jobs),
        }
