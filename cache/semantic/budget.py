"""Per-route error budget: pick the semantic serving bar from labelled examples.

A labelled example is one candidate the lookup found (its cosine and its verifier score) and
whether its stored answer agreed with a fresh upstream answer. The controller keeps counts on a
grid of (cosine, score) cells: `labels`, `wrong` and `volume` (how many lookups had their best
candidate in that cell, labelled or not). A bar serves "cosine >= c and score >= s" (a verifier
bar) or "cosine >= c2" (a cosine-only bar above it, or none); its region is those cells.

Evidence for a region = its live counts + the prior's pseudo-counts (cache.semantic.budget_prior:
the development data's tables, mixed by what the live labels look like). A region is eligible
when that evidence holds >= `min_labels` labels and its one-sided Wilson upper bound (confidence
1 - delta) is <= max_error_rate, the live labels alone do not put its Wilson lower bound over the
budget (wrong hits refute a region at once, whatever the prior says), and each of its parts
outside the shipped point (cells under its cosine floor; cells over it but left of its score)
holds >= `open_labels` live labels of its own (the start is the shipped point or stricter).
The prior's wrong counts are scaled up when the route's own labels are wrong more often than it
says (`harder`). The eligible region with the most volume is served, ties to the stricter; with
none, nothing is. Every unserved candidate is labelled by the miss that follows, which is how
regions get proven. Pure arithmetic on small arrays, no I/O (Redis: cache.semantic.budget_store).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cache.semantic.budget_prior import Prior

COS_EDGES = (0.90, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99)
# The features MLP scores top out near 0.65: its edges are dense where its scores are.
SCORE_EDGES = (0.0, 0.1, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.8, 0.9)
PRIOR_WEIGHT = 1.0  # a prior label counts this much beside a live one
OPEN_LABELS = 10  # live labels a region needs outside the shipped point before it serves there
# A budgeted route scores (and so labels) candidates from here up, below the shipped cosine
# floor: those misses tell it early what its traffic looks like (Prior.mixture), where labels
# over the shipped floor only come once repeats arrive. It serves there only on evidence.
LEARN_FLOOR = 0.88
# Wrong labels on each side of the live/prior error ratio before any evidence: the ratio starts
# at 1 and moves as the route's own labels over the shipped floor come in.
SHIFT_SMOOTH = 5.0


def wilson_upper(wrong: float, n: float, z: float) -> float:
    """One-sided Wilson score upper bound of a binomial rate; 1.0 with no observations."""
    if n <= 0:
        return 1.0
    p = wrong / n
    z2 = z * z
    centre = p + z2 / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return min(1.0, (centre + spread) / (1 + z2 / n))


def z_of(delta: float) -> float:
    """The standard normal quantile 1 - delta (bisection on erfc: no scipy needed)."""
    lo, hi = 0.0, 10.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if 0.5 * math.erfc(mid / math.sqrt(2)) > delta:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def wilson(wrong: np.ndarray, n: np.ndarray, z: float, sign: float) -> np.ndarray:
    """Vectorised Wilson bound: sign +1 the upper one (1.0 with no labels), -1 the lower (0.0)."""
    safe = np.maximum(n, 1e-12)
    p = wrong / safe
    z2 = z * z
    centre = p + z2 / (2 * safe)
    spread = z * np.sqrt(np.maximum(p * (1 - p) / safe + z2 / (4 * safe * safe), 0.0))
    out = np.clip((centre + sign * spread) / (1 + z2 / safe), 0.0, 1.0)
    res: np.ndarray = np.where(n > 0, out, 1.0 if sign > 0 else 0.0)
    return res


@dataclass(frozen=True, slots=True)
class Bar:
    """Serves (cosine >= cosine and score >= score) or (cosine >= cos_only): a verifier bar and
    a cosine-only bar (1.01: none). `open` False = serve no semantic hit."""

    cosine: float
    score: float
    open: bool
    estimate: float  # error rate in the served region, prior and live labels (nan: none)
    bound: float  # its upper confidence bound
    labels: int  # live labels in the served region
    cos_only: float = 1.01
    prior_labels: float = 0.0  # the prior's pseudo-labels in the served region
    prior_scale: float = 1.0  # how much the prior's wrong counts were scaled up (`harder`)
    # Why a closed bar is closed (empty when open). A closed bar's estimate and bound are the
    # shipped point's region, the one the route starts from: what stands between it and serving.
    reason: str = ""

    def serves(self, cosine: float, score: float) -> bool:
        if not self.open or score < 0:
            return False
        return (cosine >= self.cosine and score >= self.score) or cosine >= self.cos_only


# Why a bar is closed, said of the shipped point's region:
REASON_LABELS = "too_few_labels"  # prior and live labels under min_labels
REASON_BOUND = "bound_over_budget"  # its upper confidence bound is over the budget
REASON_REFUTED = "refuted"  # the live labels alone put its lower bound over the budget
# A starting process that has not read the fleet's counts and tenant labels yet (learn.py)
REASON_JOINING = "joining_fleet"
REASONS = (REASON_LABELS, REASON_BOUND, REASON_REFUTED, REASON_JOINING)
CLOSED = Bar(1.01, 1.01, False, float("nan"), 1.0, 0, reason=REASON_LABELS)


class BudgetGrid:
    """Counts per (cosine, score) cell and the bar they prove. Not thread-safe (one loop)."""

    def __init__(
        self,
        max_error_rate: float,
        floor: float,
        p_min: float,
        *,
        delta: float = 0.20,
        min_labels: int = 100,
        prior: Prior | None = None,
        prior_weight: float = PRIOR_WEIGHT,
        open_labels: int = OPEN_LABELS,
        half_life: float | None = None,
        clock: Callable[[], float] = time.time,
        serve_floor: float | None = None,
        shift: bool = True,
    ) -> None:
        """floor: the lowest cosine the route scores and labels; serve_floor: the shipped
        point's cosine (default: floor); p_min: the shipped point's score."""
        self.max_error_rate = max_error_rate
        self.z = z_of(delta)
        self.min_labels = min_labels
        self.prior_weight = prior_weight
        self.open_labels = open_labels
        self.cos_edges, self.score_edges = grid_edges(floor, p_min, serve_floor)
        # The shipped point's row and column: cells outside R(f_row, p_col) are served only on
        # live evidence of their own.
        self.f_row = int(
            np.searchsorted(self.cos_edges, floor if serve_floor is None else serve_floor)
        )
        self.p_col = int(np.searchsorted(self.score_edges, p_min, side="left"))
        self.shift = shift
        shape = (len(self.cos_edges), len(self.score_edges))
        self.labels = np.zeros(shape, np.float64)
        self.wrong = np.zeros(shape, np.float64)
        self.volume = np.zeros(shape, np.float64)
        self.prior = prior
        self._bar: Bar | None = None
        # Labels fade: one `half_life` seconds old weighs half (None: never). Applied in steps
        # of 1 % so that the bar is not recomputed on every lookup.
        self.half_life = half_life
        self.clock = clock
        self._faded_at = clock()

    def cell(self, cosine: float, score: float) -> tuple[int, int] | None:
        """The cell a candidate falls in; None under the cosine floor."""
        i = int(np.searchsorted(self.cos_edges, cosine, side="right")) - 1
        j = int(np.searchsorted(self.score_edges, score, side="right")) - 1
        return None if i < 0 or j < 0 else (i, j)

    def fade(self) -> None:
        if self.half_life is None:
            return
        now = self.clock()
        age = now - self._faded_at
        if age < self.half_life / 100:
            return
        f = 0.5 ** (age / self.half_life)
        self.labels, self.wrong, self.volume = self.labels * f, self.wrong * f, self.volume * f
        self._faded_at = now
        self._bar = None

    def observe(self, cosine: float, score: float) -> None:
        """A lookup's best candidate (served or not): where the traffic is."""
        self.fade()
        c = self.cell(cosine, score)
        if c is not None:
            self.volume[c] += 1

    def label(self, cosine: float, score: float, agree: bool) -> None:
        self.fade()
        c = self.cell(cosine, score)
        if c is None:
            return
        self.labels[c] += 1
        if not agree:
            self.wrong[c] += 1
        self._bar = None

    def load(self, labels: np.ndarray, wrong: np.ndarray, volume: np.ndarray) -> None:
        """Replace the counts (a refresh from the shared store, faded to now)."""
        self.labels, self.wrong, self.volume = labels, wrong, volume
        self._faded_at = self.clock()
        self._bar = None

    def mixture(self) -> dict[str, float]:
        """Which development dataset the live labels look like (empty: no prior)."""
        if self.prior is None:
            return {}
        w = self.prior.mixture(self.labels, self.wrong)
        return {n: float(x) for n, x in zip(self.prior.names, w, strict=True)}

    @property
    def stale(self) -> bool:
        """The counts moved (a label, a load, a fade step) since the bar was last chosen."""
        return self._bar is None

    def bar(self) -> Bar:
        if self._bar is None:
            self._bar = self._choose()
        return self._bar

    def harder(self, p0: np.ndarray, k0: np.ndarray) -> float:
        """How much more often this route's labels over the shipped floor are wrong than the
        prior's rates say for the same cells: (wrong + a) / (expected wrong + a), at least 1.
        The prior comes from the development data; a user's traffic can be harder, and its
        own labels, not the prior, must say so."""
        fr = min(self.f_row, len(self.cos_edges) - 1)
        n0, w0, n = p0[fr:], k0[fr:], self.labels[fr:]
        base = float(w0.sum() / n0.sum()) if n0.sum() > 0 else 0.5
        rate = (w0 + base) / (n0 + 1.0)
        expected = float((n * rate).sum())
        return max(1.0, (float(self.wrong[fr:].sum()) + SHIFT_SMOOTH) / (expected + SHIFT_SMOOTH))

    def _choose(self) -> Bar:
        """Every union of a verifier bar R(i, j) and a cosine-only bar R(i2, 0) above it (i2 >
        i, or none) is a candidate region, scored all at once on (i2, i, j) arrays. Eligible:
        prior and live labels >= min_labels, their upper bound <= budget, the live labels alone
        not proving it over budget (lower bound), and each part outside the shipped point
        (under its floor; over it, left of its score) holding >= open_labels live labels of
        its own (the start is the shipped point or stricter). The eligible region with the most
        traffic wins; ties to the stricter one."""
        scale = 1.0
        if self.prior is not None:
            p0, k0 = self.prior.pseudo(self.labels, self.wrong, self.prior_weight)
            if self.shift:
                scale = self.harder(p0, k0)
                k0 = np.minimum(p0, k0 * scale)
        else:
            p0 = k0 = np.zeros_like(self.labels)
        nc, ns = self.labels.shape
        pc, fr = min(self.p_col, ns - 1), min(self.f_row, nc - 1)
        # Traffic: live lookups, and before there are any the prior's labels stand in for them.
        # The last layer counts cells: it tells which parts of a region are not empty.
        cells = np.ones_like(self.labels)
        counts = np.stack([self.labels, self.wrong, p0, k0, self.volume + p0, cells])
        a = counts[:, ::-1, ::-1].cumsum(1).cumsum(2)[:, ::-1, ::-1]  # [c, i, j]: over R(i, j)

        def union(b: np.ndarray, col0: int) -> np.ndarray:
            """[c, i2, i, j] over R(i, j) ∪ R(i2, 0) (layer i2 = nc: no cosine-only part),
            given b[c, i, j] over R(i, j) ∩ S and b[c, i, col0] over R(i, 0) ∩ S for a set S
            of cells closed upward (then R(i2, j) ∩ S is b[c, i2, j] for i2 > i)."""
            part = b[:, None, :, :] + b[:, :, col0][:, :, None, None] - b[:, :, None, :]
            return np.concatenate([part, b[:, None]], 1)

        rows = np.maximum(np.arange(nc), fr)  # R(i, j) ∩ {rows >= fr} = R(max(i, fr), j)
        upper = a[:, rows]
        whole = union(a, 0)
        above = union(upper, 0)  # the part over the shipped floor
        inside = union(upper[:, :, np.maximum(np.arange(ns), pc)], pc)  # ... and right of p_min
        n, k, n0, k0u, v, n_cells = whole
        tot_n, tot_k = n + n0, k + k0u
        ub = wilson(tot_k, tot_n, self.z, 1.0)
        lb = wilson(k, n, self.z, -1.0)
        i2 = np.arange(nc + 1)[:, None, None]
        i = np.arange(nc)[None, :, None]
        j = np.arange(ns)[None, None, :]
        # Each part outside the shipped point needs live labels of its own: the cells under its
        # floor, and the cells over it left of its score.
        below_ok = (n_cells - above[5] < 0.5) | (n - above[0] >= self.open_labels)
        left_ok = (above[5] - inside[5] < 0.5) | (above[0] - inside[0] >= self.open_labels)
        ok = (
            ((i < i2) | (i2 == nc))  # the cosine-only part lies above the verifier bar
            & ((j > 0) | (i2 == nc))  # with score >= 0 the cosine-only part adds nothing
            & (tot_n >= self.min_labels)
            & (ub <= self.max_error_rate)
            & (lb <= self.max_error_rate)
            & below_ok
            & left_ok
        )
        idx = np.flatnonzero(ok)
        if idx.size == 0:
            start = (nc, fr, pc)  # the shipped point's region, no cosine-only part
            sn, sk = float(tot_n[start]), float(tot_k[start])
            if lb[start] > self.max_error_rate:
                reason = REASON_REFUTED
            elif sn < self.min_labels:
                reason = REASON_LABELS
            else:  # the shipped region needs no live labels of its own: its bound fails
                reason = REASON_BOUND
            return Bar(
                1.01,
                1.01,
                False,
                sk / sn if sn else float("nan"),
                float(ub[start]),
                int(n[start]),
                prior_labels=float(n0[start]),
                prior_scale=scale,
                reason=reason,
            )
        shape = ok.shape
        ii2, ii, jj = (np.broadcast_to(x, shape).ravel()[idx] for x in (i2, i, j))
        # most volume, then the lowest bound, then the stricter bar (higher cells, a higher
        # cosine-only part or none: i2 = nc)
        order = np.lexsort((ii2, jj, ii + jj, -ub.ravel()[idx], v.ravel()[idx]))
        b = int(idx[order[-1]])
        c2, ci, cj = int(ii2[order[-1]]), int(ii[order[-1]]), int(jj[order[-1]])
        return Bar(
            float(self.cos_edges[ci]),
            float(self.score_edges[cj]),
            True,
            float(tot_k.ravel()[b] / tot_n.ravel()[b]),
            float(ub.ravel()[b]),
            int(n.ravel()[b]),
            float(self.cos_edges[c2]) if c2 < nc else 1.01,
            float(n0.ravel()[b]),
            scale,
        )


def grid_edges(
    floor: float, p_min: float, serve_floor: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Never looser than the scoring floor (candidates under it are not scored); the shipped
    point's cosine and score are edges."""
    extra = {floor} if serve_floor is None else {floor, serve_floor}
    cos = np.asarray(sorted({*extra, *(c for c in COS_EDGES if c > floor)}))
    return cos, np.asarray(sorted({p_min, *SCORE_EDGES}))
