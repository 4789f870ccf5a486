"""Error-budget counts shared between gateway processes and kept across restarts, in Redis.

One hash per route and labelling context, `{prefix}sem:budget2:{route}:{context}` (a digest of
the scorer, its point, the rival rule and the answer match: after a change to any of them the
route learns afresh, and the old hash expires). A field per grid cell, count and epoch,
`l|w|v:{epoch start}:{epoch length}:{cosine edge}:{score edge}` (labels, wrong labels, volume),
named by the cell's edges so a grid with other edges still reads them, and by the epoch in
wall-clock seconds so a process with another half-life (a rolling change) ages them by their
real age. An epoch is a quarter of the route's label half-life: a count weighs 0.5 ** (its
age in half-lives, from its epoch's end) when read, and counts past 4 half-lives are deleted
(so the hash stays small).

A process counts locally and, every `interval` seconds, sends its new counts as one batch and
reads the fleet's totals (HGETALL) in one round (a pipeline; plain commands on a cluster, whose
pipeline keeps dialling a dead primary): every process then derives the same bar from the same
counts (and clocks). One batch is in flight at a time (through an outage new counts wait, and
count locally). A batch is applied by a script on the hash alone (one key: a cluster sends it
to its slot) that makes it safe to send again:
- it records the batch's id in the hash (`b:{id}`, valued when it was applied), so a batch
  whose reply was lost (a timeout while Redis still ran it) and is sent again is not counted
  twice; the process deletes the id once it has the reply, and ids left by lost replies go
  after MARKER_TTL;
- it checks the hash's generation (`gen`, set when the hash is created) against the one the
  process last wrote to. A hash that came back empty (a restart without persistence, a failover
  to a replica that had not synced) has a new generation: each process then sends everything it
  has counted (`sent`, pruned by age) again, and none loads totals until every process has had
  its read (`idle_read`) to do the same, so the fleet's bar survives as long as one process
  that counted it does.
A route with nothing new here is read only every `idle_read` seconds: an idle fleet of sidecars
does not pull every hash twice a second. A Redis failure is counted once per flush and logged once
per outage (and when it ends); the counts stay local and go with the next flush.

Every exchange writes (the batch, the hash's TTL), so it goes only when the exact tier's write
breaker lets writes go (`writes`, cache.tiers.redis_writes) and its verdict counts there: while
Redis is marked down or stalls writes, no exchange is sent (outcome `held`, once a hold), the
counts wait here (and count locally), and the first exchange after is one of the breaker's
probes. Before, a stalled Redis got an exchange every `interval`, each on a new connection
that waited out the socket timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from cache.outage import OutageLog
from cache.redis_client import REDIS_ERRORS, AnyRedis, Command, round_trip, stop_task
from cache.semantic.budget import BudgetGrid
from cache.semantic.learn import RouteBudget
from cache.tiers.redis_writes import WriteGate, settled

log = logging.getLogger("latentgate.semantic.budget")

_KINDS = {"l": 0, "w": 1, "v": 2}
EPOCHS_PER_HALF_LIFE = 4
KEEP_HALF_LIVES = 4
GEN = "gen"
# A batch id is kept this long: a batch sent again later than this (Redis unreachable for that
# long after it ran one whose reply was lost) would count twice.
MARKER_TTL = 900.0

# KEYS[1] the hash; ARGV: the batch's marker field, the generation the process last wrote to
# ('' for none), a generation for a new hash, the time now (the marker's value: its age counts
# from when the batch was applied, not made), then field, count pairs. Returns {applied, gen}:
# 1 applied, 2 applied before (the same marker), 0 not applied (the hash is another generation).
APPLY = """
local gen = redis.call('HGET', KEYS[1], 'gen')
if not gen then
  gen = ARGV[3]
  redis.call('HSET', KEYS[1], 'gen', gen)
end
if ARGV[2] ~= '' and ARGV[2] ~= gen then return {0, gen} end
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[4]) == 0 then return {2, gen} end
for i = 5, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1]) end
return {1, gen}
"""


def epoch_start(grid: BudgetGrid, now: float) -> int:
    """The wall-clock second the epoch of counts made now starts at (0: labels never fade)."""
    if grid.half_life is None:
        return 0
    length = grid.half_life / EPOCHS_PER_HALF_LIFE
    return int(now // length * length)


def epoch_length(grid: BudgetGrid) -> int:
    return 0 if grid.half_life is None else int(grid.half_life / EPOCHS_PER_HALF_LIFE)


def field_name(kind: str, start: int, length: int, cos_edge: float, score_edge: float) -> str:
    return f"{kind}:{start}:{length}:{cos_edge:.6f}:{score_edge:.6f}"


def _field(grid: BudgetGrid, kind: str, cosine: float, score: float, start: int) -> str | None:
    c = grid.cell(cosine, score)
    if c is None:
        return None
    return field_name(kind, start, epoch_length(grid), grid.cos_edges[c[0]], grid.score_edges[c[1]])


def _age(grid: BudgetGrid, start: int, length: int, now: float) -> float:
    """A count's age in half-lives (0 when labels never fade), in this process's epochs: from
    the one holding the count's epoch's last second to the current one. A process with
    another half-life (a rolling change) counts another's fresh counts as fresh, whether
    their epochs are shorter than its own or longer, and never deletes them."""
    if grid.half_life is None:
        return 0.0
    last = start + max(length, 1) - 1
    return max(epoch_start(grid, now) - epoch_start(grid, last), 0) / grid.half_life


def _arrays(
    grid: BudgetGrid, counts: Mapping[str, int], now: float
) -> tuple[list[np.ndarray], list[str]]:
    """The grid's counts, each weighed by its age; and the fields too old to keep."""
    out = [np.zeros_like(grid.labels) for _ in _KINDS]
    stale = []
    for name, n in counts.items():
        if name == GEN:
            continue
        try:
            if name.startswith("b:"):  # a batch's id; its value: when it was applied
                if now - n > MARKER_TTL:
                    stale.append(name)
                continue
            kind, at, length, cos, score = name.split(":")
            age = _age(grid, int(at), int(length), now)
            c = grid.cell(float(cos) + 1e-9, float(score) + 1e-9)
        except ValueError:
            stale.append(name)  # not a field this version writes
            continue
        if grid.half_life is not None and age > KEEP_HALF_LIVES:
            stale.append(name)
        elif c is not None and kind in _KINDS:
            out[_KINDS[kind]][c] += n * 0.5**age
    return out, stale


def _counts(raw: Mapping[bytes, bytes]) -> Counter[str]:
    """The hash's counts; a field this version cannot read (a value that is not an integer, a
    name that is not UTF-8: an operator's HSET, a later version's) is left out. Before, its
    ValueError failed the store's start, and later ended its flush loop."""
    out: Counter[str] = Counter()
    for k, v in raw.items():
        if k == b"gen":
            continue
        try:
            out[k.decode()] = int(v)
        except ValueError:
            continue
    return out


@dataclass
class _Route:
    """One route's side of the exchange: counts not yet sent, the batch sent without a reply
    yet (sent again, under the same id, until one comes), and everything this process has
    added to the hash's current generation (sent again whole if the hash is lost)."""

    new: Counter[str] = field(default_factory=Counter)
    pending: tuple[str, Counter[str]] | None = None  # (its id, its counts)
    sent: Counter[str] = field(default_factory=Counter)
    acked: list[str] = field(default_factory=list)  # markers of applied batches, to delete
    stale: list[str] = field(default_factory=list)  # fields too old to keep, to delete
    gen: str = ""
    read_at: float = -math.inf  # time.monotonic() of the last read
    hold_until: float = -math.inf  # after a lost hash: no load before the fleet has resent


def _marker() -> str:
    return f"b:{uuid.uuid4().hex[:16]}"


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
        self._routes = {r: _Route() for r in budgets}
        self._task: asyncio.Task[None] | None = None
        self.writes: WriteGate | None = None  # the exact tier's write breaker; None: not gated
        self._held = False
        # once an outage, not once a flush: a flush is due every `interval` while a batch waits,
        # so a Redis outage wrote two warnings a second for as long as it lasted
        hint = 'latentgate_semantic_sync_events_total{direction="budget",outcome="error"}'
        self._log = OutageLog(log, "semantic budget: Redis flush", hint)
        for route, b in self.budgets.items():
            b.on_count = self._counter(self._routes[route].new, b.grid)

    def key(self, route: str) -> str:
        context = self.budgets[route].context
        return f"{self.prefix}sem:budget2:{route}" + (f":{context}" if context else "")

    @staticmethod
    def _counter(new: Counter[str], grid: BudgetGrid):  # type: ignore[no-untyped-def]
        def count(cosine: float, score: float, wrong: int, labels: int, volume: int) -> None:
            start = epoch_start(grid, time.time())
            for kind, n in (("l", labels), ("w", wrong), ("v", volume)):
                if n and (f := _field(grid, kind, cosine, score, start)) is not None:
                    new[f] += n

        return count

    async def start(self) -> None:
        await self.flush()
        self._task = asyncio.create_task(self._loop(), name="semantic-budget-sync")

    async def flush(self) -> bool:
        """Send this process's new counts and load the fleet's totals; False on a Redis error."""
        now = time.monotonic()
        due = [
            r
            for r, st in self._routes.items()
            if st.new or st.pending or st.acked or now - st.read_at >= self.idle_read
        ]
        for r in due:
            st = self._routes[r]
            # One batch in flight at a time: through an outage new counts wait in `new` (and
            # count in the loaded totals), rather than a batch per tick piling up.
            if st.new and st.pending is None:
                st.pending = (_marker(), +st.new)
                st.new.clear()
        for _ in range(2):  # a second round sends again what a lost hash dropped
            if not due:
                return True
            if self.writes is not None and not self.writes.allow():
                if not self._held:  # counted once a hold, not once a tick
                    self._held = True
                    self._count("held")
                return False
            self._held = False
            try:
                exchange = partial(self._exchange, due)
                replies = await settled(self.writes, "semantic budget", exchange)
            except REDIS_ERRORS as exc:
                self._log.failed(f"{exc}; counting locally")
                self._count("error")  # one failed flush counts once
                return False
            self._log.ok()
            due = self._take(replies, now)
        return True

    def _count(self, outcome: str) -> None:
        # one metrics object serves every route
        next(iter(self.budgets.values())).metrics.sync.labels("budget", outcome).inc()

    async def _exchange(
        self, routes: list[str]
    ) -> list[tuple[str, tuple[int, str] | None, dict[bytes, bytes]]]:
        """One round trip: each route's acked batch ids deleted, its pending batch (through
        APPLY: (applied, generation)), its totals, its TTL (a hash no process writes goes)."""
        commands: list[Command] = []
        for route in routes:
            st, key = self._routes[route], self.key(route)
            if st.acked or st.stale:  # (sent again only without a reply: these never are)
                commands.append(("hdel", (key, *st.acked, *st.stale), {}))
            if st.pending is not None:
                marker, counts = st.pending
                flat = [x for f, n in counts.items() for x in (f, n)]
                new_gen = uuid.uuid4().hex[:12]
                args = (APPLY, 1, key, marker, st.gen, new_gen, int(time.time()), *flat)
                commands.append(("eval", args, {}))
            commands.append(("hgetall", (key,), {}))
            commands.append(("expire", (key, self._ttl(route)), {}))
        res = iter(await round_trip(self.redis, commands))
        out = []
        for route in routes:
            st = self._routes[route]
            if st.acked or st.stale:
                next(res)
                st.acked, st.stale = [], []
            applied = None
            if st.pending is not None:
                a, g = next(res)
                applied = (int(a), g.decode() if isinstance(g, bytes) else str(g))
            out.append((route, applied, next(res)))
            next(res)  # expire
        return out

    def _take(
        self, replies: list[tuple[str, tuple[int, str] | None, dict[bytes, bytes]]], now: float
    ) -> list[str]:
        """Apply the replies; the routes whose hash turned out lost (to send again)."""
        lost = []
        for route, applied, raw in replies:
            st, b = self._routes[route], self.budgets[route]
            batch, st.pending = st.pending, None
            rejected = applied is not None and applied[0] == 0
            if applied is not None and batch is not None and not rejected:
                st.gen = applied[1]
                st.sent.update(batch[1])
                st.acked.append(batch[0])
            gen = raw.get(b"gen", b"").decode()
            if rejected or (st.gen and gen != st.gen):
                # Not the hash this process wrote to: it was lost. Everything this process has
                # counted goes again, as one batch, to whatever generation is there by then,
                # and no totals are loaded until every process that counted has seen the loss
                # and sent its counts again (each reads within idle_read): the bar stays.
                if now >= st.hold_until:
                    st.hold_until = now + self.idle_read + self.interval
                again = st.sent
                if rejected and batch is not None:
                    again.update(batch[1])
                if again:
                    st.sent, st.gen = Counter(), ""
                    st.pending = (_marker(), again)
                    lost.append(route)
                elif gen:
                    st.gen = gen  # the new hash: loaded from the next read on
                # (an empty hash, no generation yet: keep what this process holds until a
                # process that counted has sent it again; idle ones do within idle_read)
                continue
            st.gen = gen
            if now < st.hold_until:
                continue
            totals = _counts(raw)
            totals.update(st.new)  # counted while the pipeline was out
            wall = time.time()
            (labels, wrong, volume), stale = _arrays(b.grid, totals, wall)
            b.grid.load(labels, wrong, volume)
            b.publish()
            st.read_at = now
            self._prune(st, b.grid, wall)
            # deleted with the next exchange: a write of its own here went round the breaker
            st.stale = stale
        return lost

    @staticmethod
    def _prune(st: _Route, grid: BudgetGrid, now: float) -> None:
        """Forget sent counts the hash no longer keeps (a lost hash must not get them back)."""
        if grid.half_life is None:
            return
        for f in list(st.sent):
            _, start, length, _, _ = f.split(":")
            if _age(grid, int(start), int(length), now) > KEEP_HALF_LIVES:
                del st.sent[f]

    def _ttl(self, route: str) -> int:
        """Seconds an unwritten hash is kept: as long as its counts weigh anything."""
        half_life = self.budgets[route].grid.half_life or 86400.0
        return int(half_life * KEEP_HALF_LIVES) + 60

    async def _loop(self) -> None:
        failing = False
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.flush()
                failing = False
            except Exception:  # never the end of sharing: the next flush tries again
                if not failing:  # (once a spell, not every interval)
                    log.exception("semantic budget: a flush failed; counting locally")
                failing = True

    async def aclose(self) -> None:
        await stop_task(self._task)
        with contextlib.suppress(*REDIS_ERRORS):
            await self.flush()
