"""What a model load is doing right now (export, fuse, load, warm-up), for /readyz and the log,
and the way a stopping process ends it.

Written by the loading thread, read by the event loop: a lock keeps each snapshot consistent.
"""

from __future__ import annotations

import subprocess
import threading
import time

from backends.errors import LoadStopped


class LoadProgress:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._step = "pending"
        self._detail: str | None = None
        self._expected_s: float | None = None
        self._since = time.monotonic()
        self._started = self._since
        self._stopped = False
        self._child: subprocess.Popen[str] | None = None

    def stop(self) -> None:
        """The process is stopping: the child building an artifact for this load is ended, and
        the load raises LoadStopped at its next build. A process waits for its loading threads
        before it exits, so a stop (or a port that would not bind) during the first start's
        export waited the whole export out (~20 s), past limits.shutdown_grace_s."""
        with self._lock:
            self._stopped = True
            child = self._child
        if child is not None:
            child.terminate()  # (nothing, if it has ended already)

    def check(self) -> None:
        """LoadStopped once the process stopped (the loading thread calls it before a build)."""
        with self._lock:
            if self._stopped:
                raise LoadStopped("the process stopped before the model was built")

    def adopt(self, child: subprocess.Popen[str] | None) -> None:
        """The child now building for this load (None: it ended), ended at once after a stop."""
        with self._lock:
            self._child = child
            stopped = self._stopped
        if stopped and child is not None:
            child.terminate()

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
