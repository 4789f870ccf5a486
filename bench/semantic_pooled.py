"""Pooled evaluation: cache every first text, ask every second one, score the hits.

A hit is correct only when it returns the pair's own answer (the entry whose text is the
pair's first text) and the pair is a true duplicate. Recall = correct hits / duplicate pairs;
false-hit rate = hits on non-duplicate pairs / non-duplicate pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.semantic_data import PairSet, unseen_spans
from cache.semantic.features import contradicts, restates, text_info
from cache.semantic.rivals import RIVAL_COSINE


@dataclass
class Pool:
    """The cached side (distinct first texts) and, per query, its top-k candidates."""

    entries: list[str]
    entry_vecs: np.ndarray
    own: np.ndarray  # per query: index of its own entry
    cand: np.ndarray  # (n, k) entry indices, best first
    cand_cos: np.ndarray  # (n, k)
    label: np.ndarray
    # per query: the entry whose text is the query's own (-1: none). Serving answers those from
    # the exact cache: they never reach the semantic stage and its rules.
    same: np.ndarray | None = None


def build_pool(ps: PairSet, va: np.ndarray, vb: np.ndarray, k: int = 5) -> Pool:
    index: dict[str, int] = {}
    first_row: list[int] = []
    own = np.empty(len(ps), dtype=np.int64)
    for i, t in enumerate(ps.a):
        if t not in index:
            index[t] = len(first_row)
            first_row.append(i)
        own[i] = index[t]
    ev = va[first_row]
    cand = np.empty((len(ps), k), dtype=np.int64)
    ccos = np.empty((len(ps), k), dtype=np.float32)
    for s in range(0, len(ps), 2048):
        sims = vb[s : s + 2048] @ ev.T
        top = np.argpartition(-sims, min(k, sims.shape[1] - 1), axis=1)[:, :k]
        tsim = np.take_along_axis(sims, top, axis=1)
        order = np.argsort(-tsim, axis=1)
        cand[s : s + 2048] = np.take_along_axis(top, order, axis=1)
        ccos[s : s + 2048] = np.take_along_axis(tsim, order, axis=1)
    same = np.asarray([index.get(t, -1) for t in ps.b], dtype=np.int64)
    return Pool([ps.a[i] for i in first_row], ev, own, cand, ccos, ps.label, same)


@dataclass
class Scores:
    precision: float
    recall: float
    false_hit: float
    hit_rate: float
    hits: int


def score(pool: Pool, chosen: np.ndarray) -> Scores:
    """chosen: per query the entry index served, or -1 for a miss."""
    hit = chosen >= 0
    dup = pool.label == 1
    correct = hit & dup & (chosen == pool.own)
    n_hit = int(hit.sum())
    return Scores(
        precision=float(correct.sum() / n_hit) if n_hit else float("nan"),
        recall=float(correct.sum() / max(int(dup.sum()), 1)),
        false_hit=float((hit & ~dup).sum() / max(int((~dup).sum()), 1)),
        hit_rate=float(n_hit / len(chosen)),
        hits=n_hit,
    )


def label_roots(*sets: PairSet) -> dict[str, str]:
    """Union-find roots over every labelled duplicate edge (lower-cased texts)."""
    parent: dict[str, str] = {}

    def root(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for ps in sets:
        for a, b, lab in zip(ps.a, ps.b, ps.label, strict=True):
            ra, rb = root(a.lower()), root(b.lower())
            if lab == 1:
                parent[ra] = rb
    return {t: root(t) for t in list(parent)}


def score_labelled(
    pool: Pool, chosen: np.ndarray, queries: list[str], roots: dict[str, str]
) -> Scores:
    """Like `score`, but a hit on another entry is also correct when the labels say (directly or
    through a chain of labelled duplicates) that the served entry asks the same as the query.
    QQP repeats questions across pairs, so the strict protocol counts many right answers wrong;
    pairs the labels do not connect still count as wrong."""
    hit = chosen >= 0
    dup = pool.label == 1
    same = np.array(
        [
            c >= 0 and roots.get(pool.entries[c].lower(), "a") == roots.get(q.lower(), "b")
            for c, q in zip(chosen, queries, strict=True)
        ],
        dtype=bool,
    )
    correct = hit & ((dup & (chosen == pool.own)) | same)
    n_hit = int(hit.sum())
    return Scores(
        precision=float(correct.sum() / n_hit) if n_hit else float("nan"),
        recall=float((hit & dup & ((chosen == pool.own) | same)).sum() / max(int(dup.sum()), 1)),
        false_hit=float((hit & ~dup & ~same).sum() / max(int((~dup).sum()), 1)),
        hit_rate=float(n_hit / len(chosen)),
        hits=n_hit,
    )


def choose_cosine(pool: Pool, threshold: float) -> np.ndarray:
    best = pool.cand[:, 0].copy()
    best[pool.cand_cos[:, 0] < threshold] = -1
    return best


def choose_verified(
    pool: Pool, prob: np.ndarray, floor: float, p_min: float, rival: float | None = RIVAL_COSINE
) -> np.ndarray:
    """prob: (n, k) verifier probability per candidate. Serve the most probable one over p_min,
    unless another candidate is at or over `rival` too (cache.semantic.rivals, as a route
    serves; None: no such rule)."""
    p = np.where(pool.cand_cos >= floor, prob, -1.0)
    rows = np.arange(len(p))
    j = np.argmax(p, axis=1)
    best = pool.cand[rows, j].copy()
    best[p[rows, j] < p_min] = -1
    if rival is not None:
        near = (pool.cand_cos >= rival).sum(axis=1) - (pool.cand_cos[rows, j] >= rival)
        best[near > 0] = -1
        if pool.same is not None:  # an exact repeat: the exact cache's hit, no rule applies
            repeat = pool.same >= 0
            best[repeat] = pool.same[repeat]
    return best


def restated(pool: Pool, queries: list[str], prob: np.ndarray) -> np.ndarray:
    """prob with every scored candidate (prob >= 0) that restates its query at 1.0, and every
    one that asks its minimal opposite at -1 (unscored), as the serving verifiers score them
    (cache.semantic.verifier.restated)."""
    out = np.array(prob, dtype=np.float32, copy=True)
    spans = unseen_spans()
    entries = {int(j): text_info(pool.entries[int(j)], spans) for j in np.unique(pool.cand)}
    for i, q in enumerate(queries):
        qi = text_info(q, spans)
        for k, j in enumerate(pool.cand[i]):
            if out[i, k] >= 0 and restates(qi, entries[int(j)]):
                out[i, k] = 1.0
            elif out[i, k] >= 0 and contradicts(qi, entries[int(j)]):
                out[i, k] = -1.0
    return out
