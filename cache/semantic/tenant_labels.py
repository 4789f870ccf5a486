"""Each tenant's labels shared between gateway processes and kept across restarts, in Redis.

The tenant guard (cache.semantic.tenant_guard) judges a tenant on its own labels. Kept per
process, a fleet of N sidecars each had to learn a bad tenant from the labels it saw itself:
up to N times the wrong hits before every sidecar kept it apart, and a restarted sidecar served
it at the route's bar again. Now every label a process makes for a tenant is appended to a
stream per route and labelling context, `{prefix}sem:tenants:{route}[:{context}]` (one entry
per flush: the labels packed, each with its tenant hash, cosine, score, verdict and wall-clock
time); every process reads the others' entries on the same round trip and counts them in its
own guard, so the fleet's guards hold the same labels and reach the same verdicts. At start a
process replays the stream, each label weighed by its age (0.5 per label half-life, none past
`KEEP_HALF_LIVES`), so a restart keeps a refuted tenant refuted. The stream is capped
(`STREAM_MAXLEN` entries) and expires when no process writes it. Labels in another context
(another scorer, point, rival rule or answer match) are in another stream: they never count.

The pooled counts are not here: the budget store (cache.semantic.budget_store) shares them. A
Redis failure is logged once per outage and counted (`latentgate_semantic_sync_events_total
{direction="tenant_labels", outcome="error"}`); the unsent batch is sent again, under its id,
with the next flush (an XADD that timed out may have landed: readers count an id once), and
labels made meanwhile wait behind it (up to `OUTBOX_MAX` per route); the local guard has them
already. A flush with labels to send goes only when the exact tier's write breaker lets writes
go (`writes`, cache.tiers.redis_writes), its verdict counted there; one with none (a read)
only while that breaker and the tier's are closed. Meanwhile nothing is sent (outcome `held`,
once a hold) and the labels wait; before, a stalled Redis got a flush every `interval`, each
on a new connection that waited out the socket timeout, and each XADD landing once it resumed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack

from cache.outage import OutageLog
from cache.redis_client import REDIS_ERRORS, AnyRedis, Command, round_trip, stop_task
from cache.semantic.learn import RouteBudget
from cache.tiers.redis_writes import WriteGate, settled

log = logging.getLogger("latentgate.semantic.budget")

STREAM_MAXLEN = 20_000  # entries (flushes), each holding that flush's labels
OUTBOX_MAX = 10_000  # labels per route waiting through an outage; the oldest go first
KEEP_HALF_LIVES = 4  # older labels weigh < 1/16: not replayed
_READ = 500  # entries read per route per round
_SEEN = 4096  # batch ids remembered per route (a batch is sent again only within an outage)

Label = tuple[str, float, float, bool, float]  # tenant, cosine, score, agree, wall-clock time


@dataclass
class _Route:
    outbox: deque[Label] = field(default_factory=lambda: deque(maxlen=OUTBOX_MAX))
    # The batch sent without a reply yet: sent again under the same id until one comes (a
    # timed-out XADD may still have landed: readers count an id once).
    pending: tuple[str, list[Label]] | None = None
    last_id: str = "0-0"  # the last stream entry read
    seen: OrderedDict[str, None] = field(default_factory=OrderedDict)  # batch ids counted


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def _label(value: object) -> Label | None:
    """A label as this version writes it (tenant, cosine, score, agree, time), else None."""
    if not isinstance(value, list) or len(value) != 5:
        return None
    tenant, cosine, score, agree, at = value
    numbers = (cosine, score, at)
    if not isinstance(tenant, str) or not isinstance(agree, bool):
        return None
    if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in numbers):
        return None
    if not all(math.isfinite(x) for x in numbers):
        return None
    return tenant, float(cosine), float(score), agree, float(at)


class TenantLabelShare:
    def __init__(
        self,
        redis: AnyRedis,
        budgets: Mapping[str, RouteBudget],
        prefix: str = "lg:",
        interval: float = 0.5,
    ) -> None:
        self.redis = redis
        self.budgets = {r: b for r, b in budgets.items() if b.guard is not None}
        self.prefix = prefix
        self.interval = interval
        self.origin = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._routes = {r: _Route() for r in self.budgets}
        self._task: asyncio.Task[None] | None = None
        self.writes: WriteGate | None = None  # the exact tier's write breaker; None: not gated
        self._held = False
        hint = 'latentgate_semantic_sync_events_total{direction="tenant_labels"}'
        self._log = OutageLog(log, "semantic budget: sharing tenant labels", hint)
        for route, b in self.budgets.items():
            b.on_tenant_label = self._outbox(self._routes[route])

    def key(self, route: str) -> str:
        context = self.budgets[route].context
        return f"{self.prefix}sem:tenants:{route}" + (f":{context}" if context else "")

    @staticmethod
    def _outbox(st: _Route):  # type: ignore[no-untyped-def]
        def add(tenant: str, cosine: float, score: float, agree: bool) -> None:
            st.outbox.append((tenant, cosine, score, agree, time.time()))

        return add

    async def start(self) -> None:
        """Replay what the fleet has kept (a restarted process's guards come back), then flush
        every `interval` seconds."""
        for route in self.budgets:
            try:
                while await self._read(route, replay=True):
                    pass
            except REDIS_ERRORS as exc:
                log.warning("semantic budget: replaying tenant labels failed (%s)", exc)
                self._count("error")
                break
        self._task = asyncio.create_task(self._loop(), name="semantic-tenant-labels")

    async def flush(self) -> bool:
        """Send this process's new tenant labels and count the others'; False on a Redis
        error or while the write breaker holds them (the labels wait for the next flush)."""
        writing = any(st.pending is not None or st.outbox for st in self._routes.values())
        if not self._let(writing):
            return False
        commands: list[Command] = []
        for route, st in self._routes.items():
            key = self.key(route)
            # One batch in flight at a time: through an outage new labels wait in the outbox
            if st.pending is None and st.outbox:
                st.pending = (uuid.uuid4().hex[:16], list(st.outbox))
                st.outbox.clear()
            if st.pending is not None:
                ident, labels = st.pending
                packed = msgpack.packb([list(x) for x in labels])
                entry = {"o": self.origin, "b": ident, "d": packed}
                stream = {"maxlen": STREAM_MAXLEN, "approximate": True}
                commands.append(("xadd", (key, entry), stream))
                commands.append(("expire", (key, self._ttl(route)), {}))
            commands.append(("xrange", (key, f"({st.last_id}", "+"), {"count": _READ}))
        sent = {r: st.pending for r, st in self._routes.items()}
        gate = self.writes if writing else None  # (a read's verdict is not a write's)
        try:
            replies = iter(
                await settled(gate, "tenant labels", lambda: round_trip(self.redis, commands))
            )
        except REDIS_ERRORS as exc:
            self._count("error")
            self._log.failed(f"{exc}; kept locally")
            return False
        self._log.ok()
        for route, st in self._routes.items():
            batch = sent[route]
            if batch is not None:
                next(replies), next(replies)  # the xadd, the expire
                st.pending = None
                self._count("published", len(batch[1]))
            self._take(route, next(replies), replay=False)
        return True

    def _let(self, writing: bool) -> bool:
        """May this flush go to Redis? One that writes asks the write breaker (perhaps as its
        probe); a read goes only while writes are on (it proves nothing, so it never probes)."""
        gate = self.writes
        if gate is None or (gate.allow() if writing else gate.writing()):
            self._held = False
            return True
        if writing and not self._held:  # counted once a hold, not once a tick
            self._held = True
            self._count("held")
        return False

    async def _read(self, route: str, replay: bool) -> bool:
        """One page of the route's stream; True when there may be more."""
        st = self._routes[route]
        items: Any = await self.redis.xrange(self.key(route), f"({st.last_id}", "+", count=_READ)
        self._take(route, items, replay)
        return len(items or []) == _READ

    def _take(self, route: str, items: Any, replay: bool) -> None:
        """Count the others' labels in the route's guard (replaying at start, also this
        process's earlier life's: it had another origin), each weighed by its age."""
        st, budget = self._routes[route], self.budgets[route]
        half_life = budget.grid.half_life
        now = time.time()
        applied = 0
        for ident, fields in items or []:
            st.last_id = ident.decode() if isinstance(ident, bytes) else str(ident)
            # (decoded leniently: an entry this version cannot read must not stop the reader)
            if fields.get(b"o", b"").decode(errors="replace") == self.origin:
                continue  # (counted when made)
            batch = fields.get(b"b", b"").decode(errors="replace")
            if batch:
                if batch in st.seen:
                    continue  # sent again after a reply was lost: counted once
                st.seen[batch] = None
                if len(st.seen) > _SEEN:
                    st.seen.popitem(last=False)
            try:
                labels = msgpack.unpackb(fields[b"d"], raw=False)
            except Exception:  # an entry this version cannot read: the others still count
                continue
            # Each label checked on its own: one this version cannot read (another version's
            # shape) raised out of here, which failed the stage's load at start and ended the
            # flush loop for good later (no label shared or counted again).
            for tenant, cosine, score, agree, at in filter(None, map(_label, _list(labels))):
                age = max(now - at, 0.0) / half_life if half_life else 0.0
                if age <= KEEP_HALF_LIVES:
                    budget.count_tenant_label(tenant, cosine, score, agree, 0.5**age)
                    applied += 1
        if applied:
            self._count("replayed" if replay else "applied", applied)

    def _count(self, outcome: str, n: int = 1) -> None:
        for b in self.budgets.values():  # one metrics object serves every route
            b.metrics.sync.labels("tenant_labels", outcome).inc(n)
            return

    def _ttl(self, route: str) -> int:
        half_life = self.budgets[route].grid.half_life or 86400.0
        return int(half_life * KEEP_HALF_LIVES) + 60

    async def _loop(self) -> None:
        failing = False
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.flush()
                failing = False
            except Exception:  # never the end of sharing (as the budget store's loop)
                if not failing:
                    log.exception("semantic budget: a tenant-label flush failed")
                failing = True

    async def aclose(self) -> None:
        await stop_task(self._task)
        with contextlib.suppress(*REDIS_ERRORS):
            await self.flush()
