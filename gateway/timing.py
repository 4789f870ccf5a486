"""Stage durations of one request, for Server-Timing and tracing spans."""

from __future__ import annotations

import time


class Timing:
    """Stage durations in insertion order; `add` returns now, the next stage's start."""

    __slots__ = ("stages", "start")

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.stages: list[tuple[str, float]] = []

    def add(self, name: str, since: float) -> float:
        now = time.perf_counter()
        self.stages.append((name, now - since))
        return now

    def header(self) -> str:
        total = f"total;dur={(time.perf_counter() - self.start) * 1000:.3f}"
        if not self.stages:
            return total
        return "".join([f"{n};dur={d * 1000:.3f}, " for n, d in self.stages]) + total
