"""A resize request that arrives while a rank still waits for its peers is not lost."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from shoal.train import EXIT_CHECKPOINTED
from tests.train.procs import free_port, launch_rank, logs, wait_all, wait_for


def _catches_sigterm(pid: int) -> bool:
    """True once the process has a handler for SIGTERM (``SigCgt`` in /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


def test_sigterm_during_rendezvous_checkpoints_after_the_first_steps(tmp_path: Path) -> None:
    port = free_port()
    # Rank 1 alone: the process group cannot form, so it waits in the rendezvous.
    rank1 = launch_rank(1, 2, port, tmp_path, TOY_SLEEP="0.05")
    procs = [rank1]
    try:
        try:
            wait_for(lambda: _catches_sigterm(rank1.pid), timeout_s=45)
        except TimeoutError:
            raise AssertionError("no SIGTERM handler while waiting for the process group") from None
        os.kill(rank1.pid, signal.SIGTERM)
        time.sleep(0.3)
        assert rank1.is_alive(), "SIGTERM during the rendezvous killed the rank"
        rank0 = launch_rank(0, 2, port, tmp_path, TOY_SLEEP="0.05")
        procs.insert(0, rank0)
        # Rank 0 never saw a signal: the ranks agree through the per-step control all-reduce.
        assert wait_all(procs) == [EXIT_CHECKPOINTED] * 2, logs(tmp_path)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
    assert (tmp_path / "checkpoint" / "state.pt").exists()
    steps = int((tmp_path / "progress").read_text())
    # The ranks agree every ``control_every`` (4) steps: checkpointed within the first two.
    assert 1 <= steps <= 2 * 4 + 1, steps
