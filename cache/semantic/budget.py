"""Per-route error budget: pick the semantic serving bar from labelled examples.

A labelled example is one candidate the lookup found (its cosine and its verifier score) and
whether its stored answer agreed with a fresh upstream answer. The controller keeps counts on a
grid of (cosine, score) cells: `labels`, `wrong` and `volume` (how many lookups had their best
candidate in that cell, labelled or not). A bar is a rule "cosine >= c and score >= s" on the
grid's edges; its served region is the cells above and right of it.

A bar is proven when its region holds at least `min_labels` labels and the one-sided Wilson upper
bound (confidence 1 - delta) of their error rate is <= max_error_rate. The controller serves the
proven bar with the most volume (the most hits), ties going to the stricter bar; with none proven
it serves nothing: starting closed is the strictest start, and every unserved candidate is
labelled by the miss that follows, which is how bars get proven. A wrong label inside the served
region raises its bound at once, and the next `bar()` moves to a stricter proven bar (or none).
Pure arithmetic on small arrays, no I/O: the Redis sharing lives in cache.semantic.budget_store.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

COS_EDGES = (0.90, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99)
# The features MLP scores top out near 0.65: its edges are dense where its scores are.
SCORE_EDGES = (0.0, 0.1, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.8, 0.9)


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


@dataclass(frozen=True, slots=True)
class Bar:
    """cosine >= cosine and score >= score; `open` False = serve no semantic hit."""

    cosine: float
    score: float
    open: bool
    estimate: float  # labelled error rate in the served region (nan: no labels)
    bound: float  # its upper confidence bound
    labels: int  # labels in the served region

    def serves(self, cosine: float, score: float) -> bool:
        return self.open and cosine >= self.cosine and score >= self.score


class BudgetGrid:
    """Counts per (cosine, score) cell and the bar they prove. Not thread-safe (one loop)."""

    def __init__(
        self,
        max_error_rate: float,
        floor: float,
        p_min: float,
        *,
        delta: float = 0.05,
        min_labels: int = 30,
    ) -> None:
        self.max_error_rate = max_error_rate
        self.z = z_of(delta)
        self.min_labels = min_labels
        # Never looser than the verifier's own cosine floor (candidates under it are not scored).
        self.cos_edges = np.asarray(sorted({floor, *(c for c in COS_EDGES if c > floor)}))
        self.score_edges = np.asarray(sorted({p_min, *SCORE_EDGES}))
        shape = (len(self.cos_edges), len(self.score_edges))
        self.labels = np.zeros(shape, np.float64)
        self.wrong = np.zeros(shape, np.float64)
        self.volume = np.zeros(shape, np.float64)
        self._bar: Bar | None = None

    def cell(self, cosine: float, score: float) -> tuple[int, int] | None:
        """The cell a candidate falls in; None under the cosine floor."""
        i = int(np.searchsorted(self.cos_edges, cosine, side="right")) - 1
        j = int(np.searchsorted(self.score_edges, score, side="right")) - 1
        return None if i < 0 or j < 0 else (i, j)

    def observe(self, cosine: float, score: float) -> None:
        """A lookup's best candidate (served or not): where the traffic is."""
        c = self.cell(cosine, score)
        if c is not None:
            self.volume[c] += 1

    def label(self, cosine: float, score: float, agree: bool) -> None:
        c = self.cell(cosine, score)
        if c is None:
            return
        self.labels[c] += 1
        if not agree:
            self.wrong[c] += 1
        self._bar = None

    def load(self, labels: np.ndarray, wrong: np.ndarray, volume: np.ndarray) -> None:
        """Replace the counts (a refresh from the shared store)."""
        self.labels, self.wrong, self.volume = labels, wrong, volume
        self._bar = None

    @staticmethod
    def _region(a: np.ndarray) -> np.ndarray:
        """region[i, j] = sum of a over cells i' >= i, j' >= j."""
        out: np.ndarray = a[::-1, ::-1].cumsum(0).cumsum(1)[::-1, ::-1]
        return out

    def bar(self) -> Bar:
        if self._bar is None:
            self._bar = self._choose()
        return self._bar

    def _choose(self) -> Bar:
        n, k, v = self._region(self.labels), self._region(self.wrong), self._region(self.volume)
        best: tuple[float, float, int, int] | None = None
        pick = (0, 0)
        for i in range(n.shape[0]):
            for j in range(n.shape[1]):
                if n[i, j] < self.min_labels:
                    continue
                ub = wilson_upper(k[i, j], n[i, j], self.z)
                if ub > self.max_error_rate:
                    continue
                # most volume; among equals the stricter bar (a higher score, then cosine)
                key = (v[i, j], -ub, i + j, j)
                if best is None or key > best:
                    best = key
                    pick = (i, j)
        if best is None:
            total_n, total_k = float(self.labels.sum()), float(self.wrong.sum())
            return Bar(
                1.01,
                1.01,
                False,
                total_k / total_n if total_n else float("nan"),
                wilson_upper(total_k, total_n, self.z),
                0,
            )
        i, j = pick
        return Bar(
            float(self.cos_edges[i]),
            float(self.score_edges[j]),
            True,
            float(k[i, j] / n[i, j]),
            wilson_upper(k[i, j], n[i, j], self.z),
            int(n[i, j]),
        )
