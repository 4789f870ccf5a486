"""What a model load is doing right now (export, fuse, load, warm-up), for /readyz and the log.

Written by the loading thread, read by the event loop: a lock keeps each snapshot consistent.
"""

from __future__ import annotations

import threading
import time


class LoadProgress:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._step = "pending"
        self._detail: str | None = None
        self._expected_s: float | None = None
        self._since = time.monotonic()
        self._started = self._since

    def step(self, name: str, detail: str | None = None, expected_s: float | None = None) -> None:
        with self._lock:
            self._step, self._detail, self._expected_s = name, detail, expected_s
            self._since = time.monotonic()

    @property
    def current(self) -> str:
        with self._lock:
            return self._step

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            now = time.monotonic()
            out: dict[str, object] = {
                "step": self._step,
                "step_elapsed_s": round(now - self._since, 1),
                "elapsed_s": round(now - self._started, 1),
            }
            if self._detail is not None:
                out["detail"] = self._detail
            if self._expected_s is not None:
                out["expected_s"] = self._expected_s
            return out
