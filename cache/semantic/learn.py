"""One route's error budget at work: labels from misses and audited hits feed its BudgetGrid.

- After a miss whose lookup had a candidate, the fresh upstream answer is compared with the
  candidate's stored answer (`label_after_miss`).
- A share of semantic hits also goes upstream (`should_audit` → `audit`), and the answers are
  compared the same way (`label_audit`). Audits never exceed 10 % of the route's semantic hits.
- A disagreement on a candidate the route's bar serves (every wrong audited hit) demotes that
  entry: only a closer match than this one may reuse it (SemanticStage.report_wrong).
- Every label also counts for its tenant (cache.semantic.tenant_guard): a tenant whose own labels
  refute the route's bar is served nothing semantic until they no longer do, and its labels
  count for it alone meanwhile (the route's counts describe the tenants it serves: one tenant's
  wrong labels no longer shut the route for the others). With Redis, the fleet's guards share
  them (cache.semantic.tenant_labels).

All of it runs in background tasks of its own: never raising, never delaying a client.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Literal

from cache.codec import CacheEntry
from cache.redis_client import stop_task
from cache.semantic.answer_text import answer_text
from cache.semantic.answers import ExactMatch, Matcher
from cache.semantic.budget import REASON_JOINING, REASONS, Bar, BudgetGrid
from cache.semantic.metrics import SemanticMetrics
from cache.semantic.records import Candidate, SemanticHit
from cache.semantic.stage import SemanticStage
from cache.semantic.tenant_guard import TenantGuard
from cache.semantic.verifier import Verifier

log = logging.getLogger("latentgate.semantic.budget")

AUDIT_CAP = 0.10  # audits per semantic hit, at most
LEARNING_LABELS = 100  # the served region has fewer labels than this: audit twice as often
MAX_PENDING = 256  # labels and audits in flight per route; more are shed (labels{outcome=shed})
# Audits waiting on the upstream per route: they share its pool (and breaker's max_in_flight)
# with client misses, so a slow upstream must not fill it with audits. A hit due for an audit
# while this many are out is not audited; the credit waits for the next hit.
MAX_AUDITS_IN_FLIGHT = 4
Source = Literal["miss", "audit"]


class AuditSkipped(Exception):
    """An audit that asked the upstream but has nothing to compare, for a known reason (counted
    as audits{outcome=reason}): no label, and never an error."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


Stored = CacheEntry | Callable[[], Awaitable[CacheEntry | None]] | None


class RouteBudget:
    def __init__(
        self,
        route: str,
        grid: BudgetGrid,
        matcher: Matcher,
        stage: SemanticStage,
        metrics: SemanticMetrics,
        audit_rate: float,
        scorer: Verifier,
        context: str = "",
        *,
        tenant_guard: bool = True,
    ) -> None:
        self.route = route
        # What a label means here: the scorer, its floor and point, the rival rule and the
        # answer match (cache.semantic.setup.label_context). Shared counts are kept per context,
        # so labels gathered under another one never prove this route's bar.
        self.context = context
        self.grid = grid
        self.guard = TenantGuard(grid) if tenant_guard else None
        self.scorer = scorer  # the route's verifier, scoring from the grid's floor
        self.matcher = matcher
        self.exact_match = isinstance(matcher, ExactMatch)
        self.stage = stage
        self.metrics = metrics
        self.audit_rate = audit_rate
        self.hits = 0
        self.audits = 0
        # This process's outcomes (the grid's counts are the fleet's, faded): audits by outcome
        # (agree, disagree, unusable, error), labels by source and outcome (and unusable ones).
        self.audit_outcomes: Counter[str] = Counter()
        self.label_outcomes: Counter[tuple[str, str]] = Counter()
        self._warned_at = -math.inf
        self._credit = 0.0
        self._auditing = 0  # audits waiting on the upstream
        self._tasks: set[asyncio.Task[None]] = set()
        # Called with (cosine, score, wrong, volume) deltas: the shared store's hook.
        self.on_count: Callable[[float, float, int, int, int], None] | None = None
        # Called with each label this process makes for a tenant (tenant, cosine, score,
        # agree): the fleet's tenant guards hear of it (cache.semantic.tenant_labels).
        self.on_tenant_label: Callable[[str, float, float, bool], None] | None = None
        self._logged: tuple[bool, float, float, float, str] | None = None  # the bar last logged
        # False once a reload turned the route's semantic cache off: its bar serves nothing,
        # whatever its counts say, and /metrics and /admin/semantic say so.
        self.serving = True
        # False while a starting process has not read what the fleet has learnt (the shared
        # counts, the tenant labels: cache.semantic.setup): it serves no semantic hit until
        # then. Serving on its own counts alone, it served a tenant the fleet had refuted.
        self.joined = True
        self.publish()

    # -- the bar ---------------------------------------------------------------------------

    def bar(self, tenant: str | None = None) -> Bar:
        """The route's bar; with `tenant`, the bar that tenant is served at (closed while its
        own labels refute the route's)."""
        b = self.grid.bar()
        if not self.joined and b.open:
            return dataclasses.replace(b, open=False, reason=REASON_JOINING)
        return b if tenant is None or self.guard is None else self.guard.bar(tenant, b)

    def observer(self, tenant: str) -> Callable[[float, float], None]:
        """Where this tenant's lookup counts: in the route's volume, unless its own labels
        refute it (tenant_guard.py). A refuted tenant is served nothing, so where its lookups
        fall must not pick the region served to the others (nor reach the fleet's counts)."""
        if self.guard is not None and self.guard.refuted(tenant, self.grid.bar()):
            return _unseen
        return self.observe

    def count_tenant_label(
        self, tenant: str, cosine: float, score: float, agree: bool, weight: float
    ) -> None:
        """Another process's label for a tenant (its guard only: the pooled counts come
        through the budget store)."""
        if self.guard is not None:
            self.guard.label(tenant, cosine, score, agree, weight)

    def observe(self, cosine: float, score: float) -> None:
        self.grid.observe(cosine, score)
        if self.grid.stale:  # labels faded (a label or a load publishes its own change)
            self.publish()
        if self.on_count is not None:
            self.on_count(cosine, score, 0, 0, 1)

    def publish(self) -> None:
        """The bar and its statistics on /metrics."""
        b = self.bar()
        m, r = self.metrics, self.route
        m.bar.labels(r, "cosine").set(b.cosine)
        m.bar.labels(r, "score").set(b.score)
        m.bar.labels(r, "cosine_only").set(b.cos_only)
        m.bar_open.labels(r).set(1 if b.open and self.serving else 0)
        guard = self.guard
        # counted at each scrape: a tenant's verdict changes with the route's bar and with its
        # labels fading, neither of which publishes
        m.guarded_tenants.labels(r).set_function(
            (lambda: guard.closed_count(self.grid.bar())) if guard is not None else (lambda: 0)
        )
        m.prior_scale.labels(r).set(b.prior_scale)
        m.error_rate.labels(r, "estimate").set(b.estimate)
        m.error_rate.labels(r, "bound").set(b.bound)
        m.error_rate.labels(r, "budget").set(self.grid.max_error_rate)
        for reason in REASONS:
            m.closed_reason.labels(r, reason).set(1 if b.reason == reason else 0)
        shape = (b.open, b.cosine, b.score, b.cos_only, b.reason)
        if shape != self._logged:
            self._logged = shape
            log.info("semantic budget on route %s: %s", r, describe(b, self.grid.max_error_rate))

    # -- audits ----------------------------------------------------------------------------

    def should_audit(self, hit: SemanticHit, may_audit: bool = True) -> bool:
        """Counts the hit; True for the share to audit (never above 10 % of hits so far).
        may_audit False (an only-if-cached client): counted, and no audit credit earned."""
        self.hits += 1
        if not may_audit:
            return False
        rate = self.audit_rate
        if self.grid.bar().labels < LEARNING_LABELS:
            rate = min(AUDIT_CAP, 2 * rate)
        # A credit per hit rather than a coin: exactly `rate` of the hits, evenly spread.
        self._credit += rate
        if self._credit < 1.0 - 1e-9 or self.audits + 1 > AUDIT_CAP * self.hits + 1e-9:
            return False
        if self._auditing >= MAX_AUDITS_IN_FLIGHT:
            self._credit = min(self._credit, 1.0)  # (due at the next hit, not banked up)
            return False
        self._credit -= 1.0
        self.audits += 1
        return True

    def audit(
        self,
        hit: SemanticHit,
        question: str,
        stored: Stored,
        fetch: Callable[[], Awaitable[CacheEntry | None]],
        tenant: str = "",
    ) -> None:
        """Background: ask the upstream too and label the hit by the two answers."""

        async def run() -> None:
            try:
                fresh = await fetch()
            except AuditSkipped as exc:
                log.info("semantic audit on route %s: skipped (%s)", self.route, exc)
                self._audited(exc.reason)
                return
            except Exception as exc:  # an audit that fails is no label, never an error
                log.info("semantic audit on route %s: upstream failed (%s)", self.route, exc)
                self._audited("error")
                return
            finally:
                self._auditing -= 1
            if fresh is None:
                self._audited("error")
                return
            await self._label(
                "audit",
                hit.exact_key,
                hit.similarity,
                hit.score,
                True,
                question,
                stored,
                fresh,
                tenant,
            )

        self._auditing += 1  # (from here: the next hit must see it, before the task starts)
        if not self._spawn(run(), "audit"):
            self._auditing -= 1
            self.audits -= 1  # shed before it asked anything: no audit was made

    # -- labels from misses ----------------------------------------------------------------

    def label_after_miss(
        self,
        candidate: Candidate,
        question: str,
        stored: Stored,
        fresh: CacheEntry,
        tenant: str = "",
    ) -> None:
        self._spawn(
            self._label(
                "miss",
                candidate.exact_key,
                candidate.similarity,
                candidate.score,
                candidate.served_by_bar,
                question,
                stored,
                fresh,
                tenant,
            ),
            "miss",
        )

    async def _label(
        self,
        source: Source,
        exact_key: str,
        cosine: float,
        score: float,
        demote: bool,
        question: str,
        stored: Stored,
        fresh: CacheEntry,
        tenant: str = "",
    ) -> None:
        try:
            entry = stored if isinstance(stored, CacheEntry) or stored is None else await stored()
            if entry is None:
                return  # the candidate's answer is gone (evicted, expired): nothing to compare
            a = answer_text(entry)
            b = answer_text(fresh)
            agree = None if a is None or b is None else await self.matcher.agree(question, a, b)
        except Exception as exc:  # a judge or embedder failure is no label
            # a warning (a judge that never answers leaves the route without labels), but once
            # a minute: a judge that is down fails every label
            now = time.monotonic()
            level = logging.WARNING if now - self._warned_at >= 60.0 else logging.DEBUG
            if level == logging.WARNING:
                self._warned_at = now
            log.log(level, "semantic label on route %s failed (%s)", self.route, exc)
            agree = None
        outcome = "unusable" if agree is None else "agree" if agree else "disagree"
        if source == "audit":
            self._audited(outcome)
        self.label_outcomes[source, outcome] += 1
        self.metrics.labels.labels(self.route, source, outcome).inc()
        if agree is None:
            return
        guarded = False
        if self.guard is not None:
            # a refuted tenant's label speaks for it alone (the module's docstring)
            guarded = self.guard.refuted(tenant, self.grid.bar())
            self.guard.label(tenant, cosine, score, agree)
            if self.on_tenant_label is not None:
                self.on_tenant_label(tenant, cosine, score, agree)
        if not guarded:
            self.grid.label(cosine, score, agree)
            if self.on_count is not None:
                self.on_count(cosine, score, 0 if agree else 1, 1, 0)
        self.publish()
        if not agree and demote:
            try:
                await self.stage.report_wrong(exact_key, score)
            except Exception:  # the stage logs and counts its own Redis failures
                log.exception("semantic demotion failed on route %s", self.route)

    def _audited(self, outcome: str) -> None:
        self.audit_outcomes[outcome] += 1
        self.metrics.audits.labels(self.route, outcome).inc()

    def _spawn(self, work: Coroutine[Any, Any, None], source: Source) -> bool:
        """Runs `work` in the background; False when it was shed instead."""
        if len(self._tasks) >= MAX_PENDING:
            # a slow judge or upstream must not pile up work (and the entries each label
            # holds) without bound: past this, labels are shed, and counted
            work.close()
            self.label_outcomes[source, "shed"] += 1
            self.metrics.labels.labels(self.route, source, "shed").inc()
            return False
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def drain(self) -> None:
        """Wait for the background labels in flight (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def aclose(self) -> None:
        await asyncio.gather(*(stop_task(t) for t in list(self._tasks)), return_exceptions=True)
        close = getattr(self.matcher, "aclose", None)
        if close is not None:
            await close()


def describe(b: Bar, budget: float) -> str:
    """One line for the log when a route's bar opens, moves or closes."""
    figures = (
        f"error estimate {b.estimate:.3f}, bound {b.bound:.3f} (budget {budget:.3f}) over "
        f"{b.labels} live and {b.prior_labels:.0f} prior labels"
    )
    if b.prior_scale > 1.0:
        figures += f", prior's wrong counts x{b.prior_scale:.2f}"
    if not b.open:
        return f"closed ({b.reason}); the shipped point's region: {figures}"
    bar = f"serving cosine >= {b.cosine:.2f} and score >= {b.score:.2f}"
    if b.cos_only <= 1.0:
        bar += f", or cosine >= {b.cos_only:.2f}"
    return f"{bar}; {figures}"


def _unseen(cosine: float, score: float) -> None:
    """A refuted tenant's lookup: not counted (RouteBudget.observer)."""
