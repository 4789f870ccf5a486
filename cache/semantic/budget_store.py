"""Error-budget counts shared between gateway processes and kept across restarts, in Redis.

One hash per route and labelling context, `{prefix}sem:budget:{route}:{context}` (a digest of
the scorer, its point, the rival rule and the answer match: after a change to any of them the
route learns afresh, and the old hash expires); a field per grid cell, count and epoch,
`l|w|v:{epoch}:{cosine edge}:{score edge}` (labels, wrong labels, volume), named by the cell's
edges so a grid with other edges still reads them. An epoch is a quarter of the route's label
half-life of wall-clock time: a count weighs 0.5 ** (its epoch's age / 4) when read, and epochs
past 4 half-lives are deleted (so the hash stays small). A process counts locally and, every
`interval` seconds, adds its new counts (HINCRBY) and reads the fleet's totals (HGETALL) in one
pipeline: every process then derives the same bar from the same counts (and clocks). A route
with nothing new here is read only every `idle_read` seconds: an idle fleet of sidecars does not
pull every hash twice a second. Plain hash
commands only, on the client the semantic sync publishes with (standalone, sentinel or cluster:
one key per route, so a cluster pipeline sends each to its slot). A Redis failure is logged and
counted; the counts stay local and go with the next flush.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter
from collections.abc import Mapping

import numpy as np

from cache.redis_client import REDIS_ERRORS, AnyRedis
from cache.semantic.budget import BudgetGrid
from cache.semantic.learn import RouteBudget

log = logging.getLogger("latentgate.semantic.budget")

_KINDS = {"l": 0, "w": 1, "v": 2}
EPOCHS_PER_HALF_LIFE = 4
KEEP_HALF_LIVES = 4


def epoch_of(grid: BudgetGrid, now: float) -> int:
    """The wall-clock epoch counts made now belong to (0 when labels never fade)."""
    if grid.half_life is None:
        return 0
    return int(now // (grid.half_life / EPOCHS_PER_HALF_LIFE))


def _field(grid: BudgetGrid, kind: str, cosine: float, score: float, epoch: int) -> str | None:
    c = grid.cell(cosine, score)
    if c is None:
        return None
    return f"{kind}:{epoch}:{grid.cos_edges[c[0]]:.6f}:{grid.score_edges[c[1]]:.6f}"


def _arrays(
    grid: BudgetGrid, counts: Mapping[str, int], epoch: int
) -> tuple[list[np.ndarray], list[str]]:
    """The grid's counts, each weighed by its epoch's age; and the fields too old to keep."""
    out = [np.zeros_like(grid.labels) for _ in _KINDS]
    stale = []
    for name, n in counts.items():
        try:
            kind, ep, cos, score = name.split(":")
            age = max(epoch - int(ep), 0) / EPOCHS_PER_HALF_LIFE
            c = grid.cell(float(cos) + 1e-9, float(score) + 1e-9)
        except ValueError:
            stale.append(name)  # not a field this version writes
            continue
        if grid.half_life is not None and age > KEEP_HALF_LIVES:
            stale.append(name)
        elif c is not None and kind in _KINDS:
            out[_KINDS[kind]][c] += n * 0.5**age
    return out, stale


class BudgetStore:
    def __init__(
        self,
        redis: AnyRedis,
        budgets: Mapping[str, RouteBudget],
        prefix: str = "lg:",
        interval: float = 0.5,
        idle_read: float = 5.0,
    ) -> None:
        self.redis = redis
        self.budgets = dict(budgets)
        self.prefix = prefix
        self.interval = interval
        self.idle_read = idle_read
        self._read_at: dict[str, float] = {}  # time.monotonic() of each route's last read
        self._new: dict[str, Counter[str]] = {r: Counter() for r in budgets}
        self._task: asyncio.Task[None] | None = None
        for route, b in self.budgets.items():
            b.on_count = self._counter(route, b.grid)

    def key(self, route: str) -> str:
        context = self.budgets[route].context
        return f"{self.prefix}sem:budget:{route}" + (f":{context}" if context else "")

    def _counter(self, route: str, grid: BudgetGrid):  # type: ignore[no-untyped-def]
        new = self._new[route]

        def count(cosine: float, score: float, wrong: int, labels: int, volume: int) -> None:
            epoch = epoch_of(grid, time.time())
            for kind, n in (("l", labels), ("w", wrong), ("v", volume)):
                if n and (f := _field(grid, kind, cosine, score, epoch)) is not None:
                    new[f] += n

        return count

    async def start(self) -> None:
        await self.flush()
        self._task = asyncio.create_task(self._loop(), name="semantic-budget-sync")

    async def flush(self) -> bool:
        """Add this process's new counts and load the fleet's totals; False on a Redis error."""
        now = time.monotonic()
        taken = {
            r: +c
            for r, c in self._new.items()
            if c or now - self._read_at.get(r, -math.inf) >= self.idle_read
        }
        if not taken:
            return True
        for r in taken:
            self._new[r].clear()
        try:
            async with self.redis.pipeline(transaction=False) as p:
                for route, counts in taken.items():
                    for f, n in counts.items():
                        p.hincrby(self.key(route), f, n)
                    p.hgetall(self.key(route))
                for route in taken:  # a hash no process writes any more goes on its own
                    p.expire(self.key(route), self._ttl(route))
                res = await p.execute()
        except REDIS_ERRORS as exc:
            for route, counts in taken.items():
                self._new[route].update(counts)  # kept for the next flush
            log.warning("semantic budget: Redis flush failed (%s); counting locally", exc)
            for b in self.budgets.values():
                b.metrics.sync.labels("budget", "error").inc()
            return False
        pos = 0
        for route, counts in taken.items():
            pos += len(counts)
            raw = res[pos]
            pos += 1
            totals = Counter({k.decode(): int(v) for k, v in raw.items()})
            totals.update(self._new[route])  # counted while the pipeline was out
            b = self.budgets[route]
            (labels, wrong, volume), stale = _arrays(b.grid, totals, epoch_of(b.grid, time.time()))
            b.grid.load(labels, wrong, volume)
            b.publish()
            self._read_at[route] = now
            if stale:
                with contextlib.suppress(*REDIS_ERRORS):  # the next flush tries again
                    await self.redis.hdel(self.key(route), *stale)
        return True

    def _ttl(self, route: str) -> int:
        """Seconds an unwritten hash is kept: as long as its counts weigh anything."""
        half_life = self.budgets[route].grid.half_life or 86400.0
        return int(half_life * KEEP_HALF_LIVES) + 60

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.flush()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(*REDIS_ERRORS):
            await self.flush()
