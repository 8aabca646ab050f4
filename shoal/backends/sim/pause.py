"""The pause a simulated job spends without progress after a start or resize."""

from __future__ import annotations


class RestartPause:
    """Mixin for simulated jobs: the pending pause, charged as device time the job holds."""

    rescale_left: float
    device_seconds: float

    def spend_pause(self, replicas: int, seconds: float) -> float:
        """Spend up to ``seconds`` of the pending pause on ``replicas`` devices; returns the
        seconds spent."""
        delay = min(self.rescale_left, seconds)
        self.rescale_left -= delay
        self.device_seconds += delay * replicas
        return delay
