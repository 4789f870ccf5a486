"""Purges whose Redis part failed: remembered, kept from being read back, and retried.

`POST /admin/cache/purge` drops this process's memory entries, then deletes the matching keys
in Redis. When Redis failed that (down, slow, the breaker open), the answer said so and nothing
else happened: once Redis answered again, this process read the purged entries straight back
into memory and served them, and so did every other process, until their TTL. A purge is often
the one thing that must happen (a tenant's data, an answer that was wrong), so now such a
selector is remembered: this process reads no key it matches from Redis (a miss: the upstream
answers, and a new answer is stored as usual), and the purge is run again once Redis takes
commands, after which the other processes are told (their memory tiers may hold what was
purged: `on_late_purge`, the purge fan-out). The purge's own announcement says its Redis part is
pending, so every other process keeps it too (reads none of it from Redis, runs it once Redis
answers; not announced again). The admin answer is then 202, not 200.

Bounded (`MAX_WAITING`): past that, the oldest is forgotten, counted and logged. Journaled
beside the deletes Redis did not take (cache.tiers.undeleted): a process that stops first hands
its waiting purges to the next one on the host, which reads none of what they match from Redis
and runs them once Redis answers. Before, they were forgotten, and the purged answers were
served from Redis again once it answered (docs/operations.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from cache.errors import TierError
from cache.keys import Selector
from cache.metrics import CacheMetrics
from cache.tiers.undeleted import UndeletedKeys

log = logging.getLogger("latentgate.cache.redis")

MAX_WAITING = 256


class WaitingPurges:
    def __init__(
        self,
        purge: Callable[[Selector, dict[str, int]], Awaitable[int]],
        ready: Callable[[], Awaitable[bool]],
        metrics: CacheMetrics,
        retry_s: float = 0.25,
        cap: int = MAX_WAITING,
        journal: UndeletedKeys | None = None,
    ) -> None:
        """`purge` runs one selector's purge in Redis (raises TierError) from where its last
        try stopped (RedisTier.purge's `where`), `ready` says whether Redis takes commands
        (RedisTier.purge_ready: the breaker is closed, or a probe of its own closed it).
        `journal`: where each waits until it lands, for the next process; the ones a stopped
        process left come back from it here, and are started by `resume`."""
        self._journal = journal
        self._purge = purge
        self._ready = ready
        self._metrics = metrics
        self._retry_s = retry_s
        self.cap = cap
        self.waiting: list[Selector] = []
        self._announce: set[Selector] = set()  # the ones the others are told of once landed
        self._where: dict[Selector, dict[str, int]] = {}  # how far each one's SCAN got
        self.on_late_purge: Callable[[Selector], Awaitable[object]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._turn = 0  # the index of the waiting purge tried next
        for pattern, announce in list(journal.purges.items() if journal is not None else []):
            selector = Selector.of_pattern(pattern)
            if selector is not None:
                self._keep(selector, announce, {})
            elif journal is not None:  # (not a pattern this release writes)
                journal.purge_done(pattern)
        if self.waiting:
            log.info(
                "redis: %d purges a stopped process left waiting will be run once Redis answers"
                " (none of what they match is read from Redis meanwhile)",
                len(self.waiting),
            )

    def __bool__(self) -> bool:
        return bool(self.waiting)

    def blocks(self, key: str) -> bool:
        """Whether `key` matches a purge that has not reached Redis: not to be read there."""
        return any(s.matches(key) for s in self.waiting)

    def add(
        self, selector: Selector, announce: bool = True, where: dict[str, int] | None = None
    ) -> None:
        """`announce`: have the other processes told once it lands (False: another process's
        purge, announced with its Redis part pending, which every reader runs too). `where`:
        how far a try of this purge got (RedisTier.purge); none: from the start. A selector
        already waiting starts again too (what was stored meanwhile behind its SCAN goes)."""
        self._keep(selector, announce, where if where is not None else {})
        self.resume()

    def _keep(self, selector: Selector, announce: bool, where: dict[str, int]) -> None:
        if selector not in self.waiting:
            self.waiting.append(selector)
        self._where[selector] = where
        if announce:
            self._announce.add(selector)
        if self._journal is not None:
            self._journal.keep_purge(selector.pattern(), selector in self._announce)
        if len(self.waiting) > self.cap:
            oldest = self.waiting.pop(0)
            self._announce.discard(oldest)
            self._where.pop(oldest, None)
            if self._journal is not None:
                self._journal.purge_done(oldest.pattern())
            self._metrics.purges_forgotten.inc()
            log.warning(
                "redis: more than %d purges waiting for Redis; the oldest is forgotten (its"
                " entries live in Redis until their TTL)",
                self.cap,
            )
        self._metrics.purges_waiting.set(len(self.waiting))

    def resume(self) -> None:
        """Run the waiting purges until they land (on the running loop: RedisTier.resume runs
        the ones a stopped process left, from Cache.open)."""
        if self.waiting and (self._task is None or self._task.done()):
            self._task = asyncio.ensure_future(self._retry())

    async def _retry(self) -> None:
        while self.waiting:
            await asyncio.sleep(self._retry_s)
            if not await self._ready():
                continue
            # Each in turn: one Redis keeps failing (an ACL that denies its keys' UNLINK) was
            # tried again and again at the head, and every purge behind it waited for good
            # (their keys unread here, and in every process told of them, never deleted).
            self._turn %= len(self.waiting)
            selector = self.waiting[self._turn]
            where = self._where.setdefault(selector, {})
            try:
                removed = await self._purge(selector, where)
            except TierError:
                self._turn += 1  # the next one's turn (this one's next try goes on from `where`)
                continue
            if self._where.get(selector) is not where:
                continue  # added again meanwhile (or forgotten): run again from the start
            # (still waiting until its keys are gone: a read meanwhile is kept from Redis)
            del self._where[selector]
            self.waiting.remove(selector)
            self._metrics.purges_waiting.set(len(self.waiting))
            if self._journal is not None:
                self._journal.purge_done(selector.pattern())
            log.warning("redis: a purge that had failed reached Redis (%d keys)", removed)
            if selector in self._announce and self.on_late_purge is not None:
                self._announce.discard(selector)
                try:
                    await self.on_late_purge(selector)
                except Exception:  # the cache boundary: the purge itself landed
                    log.exception("announcing a late purge failed")

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._task
