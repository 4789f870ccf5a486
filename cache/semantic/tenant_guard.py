"""Each tenant's own labels beside its route's pooled ones: the budget held in every tenant's
traffic, not only in the route's mix.

A route's bar is learned from every tenant's labels (the fleet's counts, cache.semantic.budget),
so one tenant whose questions are harder than the rest (another language, near-identical product
codes) can be served at the pooled bar while its own hits are wrong far more often than the
budget; and its wrong labels, pooled with everyone's, can keep the route shut for all. The
guard keeps each tenant's live labels on the route's grid. A tenant is *refuted* while its own
labels inside the region it is judged on (the route's served region; while the route serves
nothing, the shipped point's region it starts from) have a one-sided Wilson lower bound, at the
route's error_confidence, over max_error_rate: the rule that refutes a route's region on its
live labels, applied to one tenant's. A refuted tenant is served nothing semantic, and its
labels count for it alone, not in the route's grid, which so describes the tenants the route
serves. Its candidates are then misses, each labelled by the answer that follows, so the
evidence that reopens it, or keeps it shut, comes at the full rate of its traffic.

The guard only ever tightens: a tenant is never served below the route's bar. Its counts fade
with the route's label_half_life; with Redis configured, every process's tenant labels reach
every other's guard and survive a restart (cache.semantic.tenant_labels). The least recently
labelled tenants are forgotten past `max_tenants`.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cache.semantic.budget import Bar, BudgetGrid, wilson

REASON_TENANT = "tenant_refuted"  # a closed tenant bar: its own labels refute the route's
MAX_TENANTS = 4096  # ~1.2 KB of counts each


@dataclass(slots=True)
class _Counts:
    labels: np.ndarray
    wrong: np.ndarray
    at: float  # when the counts were last faded
    version: int = 0
    bar: Bar | None = None  # the route bar `verdict` was reached for
    seen: int = -1  # ... and the counts' version then
    verdict: _Shut | None = None  # None: not refuted


@dataclass(frozen=True, slots=True)
class _Shut:
    """A refuted tenant's verdict: the closed bar it is served at, and the figures behind it."""

    closed: Bar
    labels: float  # its live labels in the region it was judged on
    wrong: float
    bound: float  # their one-sided Wilson lower bound


@dataclass(frozen=True, slots=True)
class TenantView:
    """One guarded tenant, for /admin/semantic (its id is the key's tenant hash, shortened)."""

    tenant: str
    labels: float  # its live labels in the route's served region
    wrong: float
    lower_bound: float


class TenantGuard:
    def __init__(
        self,
        grid: BudgetGrid,
        max_tenants: int = MAX_TENANTS,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.grid = grid
        self.max_tenants = max_tenants
        # the grid's clock by default: both fade by one half-life on one time line
        self.clock = grid.clock if clock is None else clock
        self._tenants: OrderedDict[str, _Counts] = OrderedDict()
        # the shipped point's region, which a closed route starts from: a tenant is judged on
        # it while the route serves nothing (so its labels can be kept apart before it opens)
        fr = min(grid.f_row, len(grid.cos_edges) - 1)
        pc = min(grid.p_col, len(grid.score_edges) - 1)
        self._start = Bar(float(grid.cos_edges[fr]), float(grid.score_edges[pc]), True, 0.0, 0.0, 0)

    def __len__(self) -> int:
        return len(self._tenants)

    def label(
        self, tenant: str, cosine: float, score: float, agree: bool, weight: float = 1.0
    ) -> None:
        """`weight` < 1: a label made earlier (another process's, replayed), faded by its age."""
        c = self.grid.cell(cosine, score)
        if c is None:
            return
        counts = self._tenants.get(tenant)
        if counts is None:
            shape = (len(self.grid.cos_edges), len(self.grid.score_edges))
            counts = _Counts(np.zeros(shape, np.float32), np.zeros(shape, np.float32), self.clock())
            self._tenants[tenant] = counts
            while len(self._tenants) > self.max_tenants:
                self._tenants.popitem(last=False)
        else:
            self._tenants.move_to_end(tenant)
            self._fade(counts)
        counts.labels[c] += weight
        if not agree:
            counts.wrong[c] += weight
        counts.version += 1

    def refuted(self, tenant: str, bar: Bar) -> bool:
        """This tenant's own live labels refute the region it would be judged on: the route's
        served region while its bar is open, else the shipped point's region (where the route
        starts from). Cheap for a tenant without labels (one dict lookup)."""
        return self._verdict(tenant, bar) is not None

    def bar(self, tenant: str, bar: Bar) -> Bar:
        """The bar this tenant is served at: the route's, or closed while it is refuted."""
        shut = self._verdict(tenant, bar) if bar.open else None
        return bar if shut is None else shut.closed

    def closed_count(self, bar: Bar) -> int:
        """Tenants refuted under `bar`, as /admin/semantic lists them (a verdict is kept until
        the bar or the tenant's counts change, so a scrape mostly reads kept verdicts)."""
        return sum(self._verdict(t, bar) is not None for t in list(self._tenants))

    def guarded(self, bar: Bar) -> list[TenantView]:
        """The tenants refuted under the route's current bar, worst first."""
        out = []
        for tenant in list(self._tenants):
            shut = self._verdict(tenant, bar)
            if shut is not None:
                out.append(TenantView(tenant[:16], shut.labels, shut.wrong, shut.bound))
        return sorted(out, key=lambda v: -v.lower_bound)

    def _verdict(self, tenant: str, bar: Bar) -> _Shut | None:
        counts = self._tenants.get(tenant)
        if counts is None:
            return None
        self._fade(counts)
        if counts.bar is not bar or counts.seen != counts.version:
            counts.bar, counts.seen = bar, counts.version
            region = bar if bar.open else self._start
            n, k = self._in_region(counts, region)
            lower = float(wilson(np.asarray(k), np.asarray(n), self.grid.z, -1.0))
            counts.verdict = None
            if lower > self.grid.max_error_rate:
                counts.verdict = _Shut(
                    dataclasses.replace(
                        bar, open=False, estimate=k / n, labels=int(n), reason=REASON_TENANT
                    ),
                    n,
                    k,
                    lower,
                )
        return counts.verdict

    def _in_region(self, counts: _Counts, bar: Bar) -> tuple[float, float]:
        """Its labels and wrong labels in the cells `bar` serves (bars sit on cell edges)."""
        cos = self.grid.cos_edges[:, None]
        score = self.grid.score_edges[None, :]
        served = ((cos >= bar.cosine - 1e-9) & (score >= bar.score - 1e-9)) | (
            cos >= bar.cos_only - 1e-9
        )
        return float(counts.labels[served].sum()), float(counts.wrong[served].sum())

    def _fade(self, counts: _Counts) -> None:
        half_life = self.grid.half_life
        if half_life is None:
            return
        now = self.clock()
        age = now - counts.at
        if age < half_life / 100:
            return
        f = np.float32(0.5 ** (age / half_life))
        counts.labels *= f
        counts.wrong *= f
        counts.at = now
        counts.version += 1
