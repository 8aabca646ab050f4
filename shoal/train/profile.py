"""Step times per configuration, the input of the scheduler's throughput model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Config = tuple[int, int, int, int]  # (num_nodes, num_replicas, local_bsz, accum_steps)
_Key = tuple[str, int, int, int, int]  # (device type, *Config); "" where it was not told


@dataclass(slots=True)
class _Sums:
    count: int = 0
    step_time: float = 0.0
    sync_time: float = 0.0


class StepProfile:
    """Mean step and sync time per (num_nodes, num_replicas, local_bsz, accum_steps) and device
    type.

    The table travels in checkpoints, so a job moved to another device type keeps what it
    measured on the earlier ones; ``device_type`` (``SHOAL_DEVICE_TYPE``) keeps those apart.
    Rows carry it as ``device_type`` (absent where the backend did not tell it).
    The first ``warmup_steps`` steps of each configuration in a process are not recorded: they
    include allocator warm-up and DDP's bucket rebuild.
    """

    def __init__(self, warmup_steps: int = 2, device_type: str | None = None) -> None:
        self.warmup_steps = warmup_steps
        self.device_type = device_type or ""
        self._table: dict[_Key, _Sums] = {}
        self._seen: dict[Config, int] = {}

    def record(self, config: Config, step_time: float, sync_time: float) -> None:
        seen = self._seen.get(config, 0)
        self._seen[config] = seen + 1
        if seen < self.warmup_steps:
            return
        sums = self._table.setdefault((self.device_type, *config), _Sums())
        sums.count += 1
        sums.step_time += step_time
        sums.sync_time += sync_time

    def mean(self, config: Config) -> tuple[float, float] | None:
        """Mean (step, sync) time of ``config`` on this process's device type."""
        sums = self._table.get((self.device_type, *config))
        if sums is None or sums.count == 0:
            return None
        return sums.step_time / sums.count, sums.sync_time / sums.count

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for (dtype, nodes, replicas, bsz, accum), s in sorted(self._table.items()):
            row: dict[str, Any] = {"device_type": dtype} if dtype else {}
            row.update(
                num_nodes=nodes,
                num_replicas=replicas,
                local_bsz=bsz,
                accum_steps=accum,
                step_time=s.step_time / s.count,
                sync_time=s.sync_time / s.count,
                count=s.count,
            )
            out.append(row)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"rows": self.rows()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._table = {}
        for row in state["rows"]:
            key = (str(row.get("device_type") or ""), row["num_nodes"], row["num_replicas"],
                   row["local_bsz"], row["accum_steps"])
            n = int(row["count"])
            self._table[key] = _Sums(n, row["step_time"] * n, row["sync_time"] * n)
