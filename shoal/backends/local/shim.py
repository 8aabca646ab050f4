"""Supervisor of one replica: runs the command, forwards signals, records the exit code.

``python -m shoal.backends.local.shim EXIT_FILE PID_FILE -- COMMAND...``

The backend starts one shim per replica in its own session, so replicas outlive a crashed or
killed service; the exit file lets a restarted service learn how a replica it did not start
ended (exit codes of other processes' children cannot be waited for). Kept free of heavy
imports: it starts in milliseconds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: shim EXIT_FILE PID_FILE -- COMMAND...", file=sys.stderr)
        return 2
    exit_file, pid_file, command = Path(argv[0]), Path(argv[1]), argv[3:]
    child = subprocess.Popen(command)
    _write_atomic(pid_file, str(child.pid))

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    code = child.wait()
    _write_atomic(exit_file, str(code))
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
