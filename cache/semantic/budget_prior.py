"""The error budget's prior: labelled counts per (cosine, score) cell from the development data.

`python -m bench.budget_prior` replays the calib parts of QQP, PAWS and STS-B through the shipped
verifier and writes one table per dataset (labels, wrong) to budget_prior.npz beside
verifier.npz. A route does not pool them: the live labels decide which table its traffic looks
like (`Prior.mixture`), so a prior dominated by question pairs never speaks for word-swap or
sentence-similarity traffic. Pure arithmetic, no I/O beyond `load`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cache.semantic.rivals import RIVAL_COSINE

log = logging.getLogger("latentgate.semantic.budget")

DEFAULT_PRIOR = Path(__file__).with_name("budget_prior.npz")
SMOOTH = 2.0  # pseudo-labels pulling a sparse cell's rate toward its dataset's overall rate
SHARES = (0.0, 0.25, 0.5, 0.75, 1.0)  # first-phase shares the mixture averages over


def cell_index(edges: np.ndarray, values: np.ndarray) -> np.ndarray:
    return np.searchsorted(edges, values + 1e-9, side="right") - 1


@dataclass(frozen=True)
class Prior:
    """names[d]; labels and wrong per phase, [d, phase, i, j], on the route's grid. The phases
    of a replayed stream: its first texts asked against each other, then its second texts
    against them (a route's own traffic is some mix of the two: mostly new questions early,
    mostly repeats later)."""

    names: tuple[str, ...]
    phase_labels: np.ndarray
    phase_wrong: np.ndarray
    verifier_sha256: str = ""
    # the rival cosine its replay left contested lookups out with (None: none were)
    rival_cosine: float | None = None

    @property
    def labels(self) -> np.ndarray:
        out: np.ndarray = self.phase_labels.sum(1)
        return out

    @property
    def wrong(self) -> np.ndarray:
        out: np.ndarray = self.phase_wrong.sum(1)
        return out

    @classmethod
    def load(cls, path: Path, cos_edges: np.ndarray, score_edges: np.ndarray) -> Prior:
        """The artifact's tables regridded onto these edges (a cell counts into the grid cell
        that holds its lower edges; cells under the grid's floor are dropped)."""
        with np.load(path, allow_pickle=False) as z:
            src_c, src_s, counts = z["cos_edges"], z["score_edges"], z["counts"]
            meta = json.loads(str(z["meta"]))
        if counts.ndim == 4:  # one phase
            counts = counts[:, None]
        shape = (*counts.shape[:2], len(cos_edges), len(score_edges))
        labels, wrong = np.zeros(shape), np.zeros(shape)
        ci, sj = cell_index(cos_edges, src_c), cell_index(score_edges, src_s)
        for a, i in enumerate(ci):
            for b, j in enumerate(sj):
                if i >= 0 and j >= 0:
                    labels[:, :, i, j] += counts[:, :, 0, a, b]
                    wrong[:, :, i, j] += counts[:, :, 1, a, b]
        return cls(
            tuple(meta["datasets"]),
            labels,
            wrong,
            meta.get("verifier_sha256", ""),
            meta.get("rival_cosine"),
        )

    def rates(self, share: float | None = None) -> np.ndarray:
        """Each dataset's error rate per cell, smoothed toward its overall rate: over all its
        labels, or (`share`) for traffic whose labels come that share from the first phase."""
        n, k = self.phase_labels, self.phase_wrong
        if share is None or n.shape[1] == 1:
            n, k = n.sum(1), k.sum(1)
        else:
            tot = np.maximum(n.sum((2, 3)), 1.0)  # [d, phase]
            w = np.stack([share / tot[:, 0], (1 - share) / tot[:, 1]], 1)[:, :, None, None]
            eff = (share * tot[:, 0] + (1 - share) * tot[:, 1])[:, None, None]
            n, k = (n * w).sum(1) * eff, (k * w).sum(1) * eff
        base = (k.sum((1, 2)) / np.maximum(n.sum((1, 2)), 1e-9))[:, None, None]
        out: np.ndarray = np.clip((k + SMOOTH * base) / (n + SMOOTH), 1e-3, 0.999)
        return out

    def mixture(self, labels: np.ndarray, wrong: np.ndarray) -> np.ndarray:
        """Posterior weight of each dataset given the live counts (uniform start): the
        likelihood of the live labels under each table's per-cell rates, averaged over the
        share of first-phase labels (0, 1/4, ..., 1: a route does not know its phase)."""
        lls = []
        for share in SHARES if self.phase_labels.shape[1] > 1 else (None,):
            e = self.rates(share)
            lls.append((wrong * np.log(e) + (labels - wrong) * np.log(1 - e)).sum((1, 2)))
        a = np.stack(lls)  # [share, d]
        top = a.max(0)
        ll = top + np.log(np.exp(a - top).mean(0))
        w: np.ndarray = np.exp(ll - ll.max())
        out: np.ndarray = w / w.sum()
        return out

    def pseudo(self, labels: np.ndarray, wrong: np.ndarray, weight: float) -> np.ndarray:
        """[pseudo-labels, pseudo-wrong] per cell: the tables mixed by the live evidence,
        scaled by `weight`."""
        pi = self.mixture(labels, wrong)[:, None, None]
        n = (pi * self.labels).sum(0) * weight
        k = (pi * self.wrong).sum(0) * weight
        return np.stack([n, k])


def digest(path: Path) -> str:
    """What a prior records of the verifier artifact it was built with."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def load_prior(
    path: Path,
    verifier: Path,
    cos_edges: np.ndarray,
    score_edges: np.ndarray,
    rival_cosine: float | None = RIVAL_COSINE,
) -> Prior | None:
    """The prior for this verifier artifact and rival rule, or None (logged): a missing or
    unreadable file, one built with another verifier, whose scores it does not describe, or
    with another rival cosine (its labels leave out other lookups than the route serves: with
    the rule off, the contested ones it left out are the error-prone ones)."""
    try:
        prior = Prior.load(path, cos_edges, score_edges)
        ver = digest(verifier)
    except (OSError, ValueError, KeyError) as exc:
        log.warning("semantic budget: no prior (%s); the bar is learned from live labels", exc)
        return None
    if prior.verifier_sha256 != ver:
        log.warning(
            "semantic budget: prior %s was built for verifier %s, not %s; not used "
            "(rebuild: python -m bench.budget_prior)",
            path,
            prior.verifier_sha256,
            ver,
        )
        return None
    if prior.rival_cosine != rival_cosine:
        log.warning(
            "semantic budget: prior %s was built with rival_cosine %s, the route uses %s; not "
            "used (rebuild: python -m bench.budget_prior --rival ...)",
            path,
            prior.rival_cosine,
            rival_cosine,
        )
        return None
    return prior
