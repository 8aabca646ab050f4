"""What a stream job's source counted over the last seconds: the input rate, and what one device
really processes per second.

The source's counters (``arrived``, and ``timed`` / ``busy_s``: samples done by workers that
reported the seconds they spent on them) are read every tick; differences over the window give

- the **input rate**: samples arrived per second;
- the **speed of one device**: samples per busy worker-second. It is measured while workers
  have work, so it does not fall when the input is slow (a rate of processed samples would
  only echo the input). The window's samples of one device type count: after a move to
  another type, the old type's speed says nothing.

Counters that go down (a new source after a crash starts them again) start a new window.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

# Busy worker-seconds a speed must rest on: a few leases, not one.
MIN_BUSY_S = 2.0


@dataclass(frozen=True)
class SourceSample:
    time: float
    arrived: int
    timed: int  # samples done by workers that reported their time
    busy_s: float  # those workers' seconds on them
    device_type: str | None  # the type the workers ran on


class StreamWindow:
    def __init__(self, span_s: float):
        self.span_s = span_s
        self.samples: deque[SourceSample] = deque()

    def add(self, sample: SourceSample) -> None:
        last = self.samples[-1] if self.samples else None
        if last is not None and (sample.timed < last.timed or sample.busy_s < last.busy_s
                                 or sample.arrived < last.arrived):
            self.samples.clear()
        self.samples.append(sample)
        while len(self.samples) > 2 and self.samples[1].time <= sample.time - self.span_s:
            self.samples.popleft()

    def input_rate(self) -> float | None:
        """Samples/s arrived over the window; None before two readings."""
        first, last = self.samples[0], self.samples[-1]
        if last.time <= first.time:
            return None
        return (last.arrived - first.arrived) / (last.time - first.time)

    def device_speed(self) -> tuple[str, float] | None:
        """(device type, samples per busy second of one device) over the window's readings of
        the latest type; None until ``MIN_BUSY_S`` worker-seconds back it."""
        last = self.samples[-1] if self.samples else None
        if last is None or last.device_type is None:
            return None
        first = last
        for sample in reversed(self.samples):
            if sample.device_type != last.device_type:
                break
            first = sample
        busy = last.busy_s - first.busy_s
        if busy < MIN_BUSY_S:
            return None
        return last.device_type, (last.timed - first.timed) / busy
