"""Reports to the scheduler: POST ``{url}/api/jobs/{job}/report`` from a background thread.

Reporting never blocks or crashes training: ``submit`` only stores the latest payload, a daemon
thread sends it with a short timeout, and failures become one warning. The scheduler may answer
with ``{"batch_size": N}`` to request a new global batch size; it is exposed as
``requested_batch_size`` and applied by the trainer at a step boundary on every rank.
"""

from __future__ import annotations

import logging
import threading
from typing import Any
from urllib.parse import quote

import httpx

log = logging.getLogger("shoal.train")


class Reporter:
    def __init__(self, scheduler_url: str | None, job: str, timeout_s: float = 2.0) -> None:
        self.url = None
        if scheduler_url:
            self.url = f"{scheduler_url}/api/jobs/{quote(job, safe='')}/report"
        self.timeout_s = timeout_s
        self.sent = 0
        self.failed = 0
        self.requested_batch_size: int | None = None
        self._pending: dict[str, Any] | None = None
        self._cond = threading.Condition()
        self._closing = False
        self._warned = False
        self._thread: threading.Thread | None = None
        if self.url:
            self._thread = threading.Thread(target=self._run, name="shoal-reporter", daemon=True)
            self._thread.start()

    @property
    def enabled(self) -> bool:
        return self.url is not None

    def submit(self, payload: dict[str, Any]) -> None:
        """Queue ``payload`` (replacing any unsent one); returns at once."""
        if not self.url:
            return
        with self._cond:
            self._pending = payload
            self._cond.notify()

    def close(self, flush_timeout_s: float = 3.0) -> None:
        """Send what is queued (bounded wait) and stop the thread."""
        if self._thread is None:
            return
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(flush_timeout_s)
        self._thread = None

    def _run(self) -> None:
        with httpx.Client(timeout=self.timeout_s) as client:
            while True:
                with self._cond:
                    while self._pending is None and not self._closing:
                        self._cond.wait()
                    payload, self._pending = self._pending, None
                    closing = self._closing
                if payload is not None:
                    self._post(client, payload)
                if closing:
                    return

    def _post(self, client: httpx.Client, payload: dict[str, Any]) -> None:
        assert self.url is not None
        try:
            response = client.post(self.url, json=payload)
            response.raise_for_status()
        except (httpx.HTTPError, OSError) as exc:
            self.failed += 1
            if not self._warned:
                self._warned = True
                log.warning("shoal: report to %s failed (%s); training continues", self.url, exc)
            return
        self.sent += 1
        try:
            answer = response.json()
        except ValueError:
            return
        if isinstance(answer, dict) and isinstance(answer.get("batch_size"), int):
            self.requested_batch_size = int(answer["batch_size"])
