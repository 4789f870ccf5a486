"""The stand-in engines and the batcher factory the batcher tests share."""

from __future__ import annotations

import threading
import time
from typing import Any

from prometheus_client import CollectorRegistry

from backends.batcher import Batcher
from backends.settings import BatcherSettings


class Recorder:
    def __init__(self, delay_s: float = 0.0) -> None:
        self.batches: list[list[tuple[str, int]]] = []
        self.delay_s = delay_s
        self.threads: set[str] = set()

    def __call__(self, items: list[tuple[str, int]]) -> list[str]:
        self.threads.add(threading.current_thread().name)
        self.batches.append(list(items))
        time.sleep(self.delay_s)
        return [f"{text}:{n}" for text, n in items]


def batcher(
    rec: Recorder, registry: CollectorRegistry | None = None, **kw: Any
) -> Batcher[tuple[str, int], str]:
    settings = BatcherSettings.model_validate(kw)
    return Batcher("m", rec, settings, length=lambda it: it[1], registry=registry)


class Gate(Recorder):
    """Holds the first engine run until released, so callers can queue work behind it."""

    def __init__(self) -> None:
        super().__init__()
        self.running = threading.Event()
        self.release = threading.Event()

    def __call__(self, items: list[tuple[str, int]]) -> list[str]:
        self.running.set()
        self.release.wait(10)
        return super().__call__(items)

    def run_of(self, text: str) -> int:
        return next(i for i, batch in enumerate(self.batches) if any(t == text for t, _ in batch))
