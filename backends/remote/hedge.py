"""Hedging: when the first attempt is slow, race a second copy on another replica.

The first good answer wins; the loser is cancelled (a cancelled request closes its connection,
a finished loser's stream is closed, never returned to the pool dirty).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import Awaitable, Callable

from backends.base import UpstreamResponse
from backends.settings import HedgeSettings

_DEFAULT_AFTER_S = 0.05
_MIN_SAMPLES = 20


class LatencyWindow:
    """The pool's most recent response latencies (seconds), for percentile hedge delays."""

    def __init__(self, size: int = 512) -> None:
        self._values: deque[float] = deque(maxlen=size)

    def add(self, seconds: float) -> None:
        self._values.append(seconds)

    def percentile(self, p: float) -> float | None:
        if len(self._values) < _MIN_SAMPLES:
            return None
        ordered = sorted(self._values)
        return ordered[min(len(ordered) - 1, math.ceil(p / 100.0 * len(ordered)) - 1)]


def hedge_delay_s(settings: HedgeSettings, window: LatencyWindow) -> float:
    if settings.after_percentile is not None:
        value = window.percentile(settings.after_percentile)
        if value is not None:
            return value
    if settings.after_ms is not None:
        return settings.after_ms / 1000.0
    return _DEFAULT_AFTER_S


async def discard(resp: UpstreamResponse) -> None:
    """Drop a response nobody will read: its streamed body's connection is closed."""
    if resp.stream is not None:
        await resp.stream.aclose()  # type: ignore[attr-defined]
        resp.stream = None


async def race(
    first: Callable[[], Awaitable[UpstreamResponse]],
    second: Callable[[], Awaitable[UpstreamResponse]],
    delay_s: float,
    may_hedge: Callable[[], bool],
) -> tuple[UpstreamResponse, bool]:
    """Run `first`; after delay_s without an answer, and if may_hedge(), also `second`.

    Returns (response, hedge_won). A 5xx from one side waits for the other; errors from one
    side are ignored while the other can still answer.
    """
    t1 = asyncio.ensure_future(first())
    tasks = {t1}
    done, _ = await asyncio.wait(tasks, timeout=delay_s)
    t2: asyncio.Future[UpstreamResponse] | None = None
    if not done and may_hedge():
        t2 = asyncio.ensure_future(second())
        tasks.add(t2)
    pending = set(tasks)
    fallback: asyncio.Future[UpstreamResponse] | None = None
    winner: asyncio.Future[UpstreamResponse] | None = None
    try:
        while pending and winner is None:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t.exception() is None and t.result().status < 500 and winner is None:
                    winner = t
                elif fallback is None or fallback.exception() is not None:
                    fallback = t
        chosen = winner or fallback
        assert chosen is not None
        return chosen.result(), chosen is t2
    finally:
        for t in pending:
            t.cancel()
        for t in tasks:
            if t is winner or (winner is None and t is fallback):
                continue
            if not t.done():
                # The loser's error or its cancellation: nobody wants it.
                with contextlib.suppress(BaseException):
                    await t
            if t.done() and not t.cancelled() and t.exception() is None:
                await discard(t.result())
