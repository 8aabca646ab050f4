"""Step times per configuration, the input of the scheduler's throughput model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Config = tuple[int, int, int, int]  # (num_nodes, num_replicas, local_bsz, accum_steps)


@dataclass(slots=True)
class _Sums:
    count: int = 0
    step_time: float = 0.0
    sync_time: float = 0.0


class StepProfile:
    """Mean step and sync time per (num_nodes, num_replicas, local_bsz, accum_steps).

    The first ``warmup_steps`` steps of each configuration in a process are not recorded: they
    include allocator warm-up and DDP's bucket rebuild.
    """

    def __init__(self, warmup_steps: int = 2) -> None:
        self.warmup_steps = warmup_steps
        self._table: dict[Config, _Sums] = {}
        self._seen: dict[Config, int] = {}

    def record(self, config: Config, step_time: float, sync_time: float) -> None:
        seen = self._seen.get(config, 0)
        self._seen[config] = seen + 1
        if seen < self.warmup_steps:
            return
        sums = self._table.setdefault(config, _Sums())
        sums.count += 1
        sums.step_time += step_time
        sums.sync_time += sync_time

    def mean(self, config: Config) -> tuple[float, float] | None:
        sums = self._table.get(config)
        if sums is None or sums.count == 0:
            return None
        return sums.step_time / sums.count, sums.sync_time / sums.count

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for (nodes, replicas, bsz, accum), s in sorted(self._table.items()):
            out.append(
                {
                    "num_nodes": nodes,
                    "num_replicas": replicas,
                    "local_bsz": bsz,
                    "accum_steps": accum,
                    "step_time": s.step_time / s.count,
                    "sync_time": s.sync_time / s.count,
                    "count": s.count,
                }
            )
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"rows": self.rows()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._table = {}
        for row in state["rows"]:
            key = (row["num_nodes"], row["num_replicas"], row["local_bsz"], row["accum_steps"])
            n = int(row["count"])
            self._table[key] = _Sums(n, row["step_time"] * n, row["sync_time"] * n)
