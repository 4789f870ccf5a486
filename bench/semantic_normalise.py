"""Would a normalised embedding input raise recall? `python -m bench.semantic_normalise`.

An offline experiment (issue 14), calib parts only: the embedder reads each text as is, or
normalised (spacing collapsed, closing punctuation and spaces stripped, optionally casefolded).
Only the vectors change: the verifier's features, the exact-repeat rule and the labels still see
the text as asked, as they would if only the embedding input were normalised. Per set it prints
the pairs' cosines both ways, then precision and recall (labelled protocol, as
bench.semantic_eval) at plain cosine thresholds, at the shipped point and at the budget's usual
0.10 bar (that point, or cosine >= 0.98). Run with LATENTGATE_BENCH_FULL=1 for whole calib parts.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np

from bench.semantic_data import MODEL_TAG, PairSet, embed_cached, splits, st_encoder
from bench.semantic_pooled import Pool, build_pool, choose_cosine, label_roots, score_labelled
from bench.train_verifier import pool_probs
from cache.semantic.rivals import RIVAL_COSINE
from cache.semantic.verifier import MlpVerifier

COSINES = (0.85, 0.88, 0.90, 0.92, 0.93, 0.94, 0.96, 0.98)
CLOSING = " \t\n?.!,;:…"


def strip(text: str) -> str:
    """Inner spacing collapsed, closing punctuation and spaces stripped (never to nothing)."""
    t = " ".join(text.split()).rstrip(CLOSING)
    return t or text


NORMALISERS: dict[str, Callable[[str], str]] = {
    "raw": str,
    "strip": strip,
    "strip+casefold": lambda t: strip(t).casefold(),
}


def choose_bar(
    pool: Pool, prob: np.ndarray, floor: float, p_min: float, cos_only: float = 1.01
) -> np.ndarray:
    """As a route serves a bar (cache.semantic.stage): scored candidates (cosine >= floor),
    none while another candidate is at the rival cosine, the most probable one that passes
    (cosine >= floor and score >= p_min) or cosine >= cos_only; exact repeats are exact hits."""
    cos = pool.cand_cos
    p = np.where(cos >= floor, prob, -1.0)
    near = (cos >= RIVAL_COSINE).sum(axis=1)
    free = near[:, None] - (cos >= RIVAL_COSINE) == 0
    ok = (p >= 0) & free & (((cos >= floor) & (p >= p_min)) | (cos >= cos_only))
    p = np.where(ok, p, -2.0)
    rows = np.arange(len(p))
    j = np.argmax(p, axis=1)
    best = pool.cand[rows, j].copy()
    best[p[rows, j] < -1] = -1
    if pool.same is not None:
        best[pool.same >= 0] = pool.same[pool.same >= 0]
    return best


def closing(text: str) -> str:
    t = text.rstrip()
    return t[len(t.rstrip(CLOSING)) :]


def restatements(ps: PairSet, enc) -> None:  # type: ignore[no-untyped-def]
    """The trial's case: each first text that closes with "?" asked again without it. Stripped,
    both embed the same text (cosine 1); as asked, how many fall under the shipped floor?"""
    asked = sorted({t for t in ps.a if t.rstrip().endswith("?") and strip(t) != t})
    if not asked:
        return
    va = embed_cached(asked, enc, MODEL_TAG)
    vb = embed_cached([t.rstrip()[:-1] for t in asked], enc, MODEL_TAG)
    cos = pair_cosines(va, vb)
    q = np.quantile(cos, [0.01, 0.05, 0.5])
    print(
        f"  {len(asked)} questions without their '?': cosine p1 {q[0]:.4f} p5 {q[1]:.4f} "
        f"median {q[2]:.4f}; under 0.93: {int((cos < 0.93).sum())}, "
        f"under 0.98: {int((cos < 0.98).sum())}"
    )


def pair_cosines(va: np.ndarray, vb: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", va, vb)


def run(name: str, ps: PairSet, enc, ver: MlpVerifier, raw_cos: np.ndarray | None) -> np.ndarray:  # type: ignore[no-untyped-def]
    roots = label_roots(ps)
    norm = NORMALISERS[name]
    va = embed_cached([norm(t) for t in ps.a], enc, MODEL_TAG)
    vb = embed_cached([norm(t) for t in ps.b], enc, MODEL_TAG)
    cos = pair_cosines(va, vb)
    dup = ps.label == 1
    line = f"  pair cosine: duplicates median {np.median(cos[dup]):.4f} mean {cos[dup].mean():.4f}"
    line += f"; non-duplicates median {np.median(cos[~dup]):.4f} mean {cos[~dup].mean():.4f}"
    if raw_cos is not None:
        up, down = int((cos > raw_cos + 1e-4).sum()), int((cos < raw_cos - 1e-4).sum())
        line += f"; against raw: {up} up, {down} down"
        for lab, m in (("dup", dup), ("non-dup", ~dup)):
            crossed = m & (raw_cos < 0.93) & (cos >= 0.93)
            fell = m & (raw_cos >= 0.93) & (cos < 0.93)
            line += f"; {lab} crossing 0.93 up {int(crossed.sum())} down {int(fell.sum())}"
    print(line)
    pool = build_pool(ps, va, vb)
    prob = pool_probs(ver, ps, pool, vb)

    def show(label: str, chosen: np.ndarray) -> None:
        s = score_labelled(pool, chosen, ps.b, roots)
        print(
            f"  {label:<34} P {s.precision:.3f} R {s.recall:.3f} FH {s.false_hit:.3f} hits {s.hits}"
        )

    for c in COSINES:
        show(f"cosine>={c}", choose_cosine(pool, c))
    show(f"shipped ({ver.floor}, {ver.p_min})", choose_bar(pool, prob, ver.floor, ver.p_min))
    show("shipped, or cosine>=0.98", choose_bar(pool, prob, ver.floor, ver.p_min, 0.98))
    return cos


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sets", default="qqp,paws")
    ap.add_argument("--normalisers", default=",".join(NORMALISERS))
    args = ap.parse_args()
    ver = MlpVerifier.load()
    data = splits()
    enc = st_encoder()
    for d in args.sets.split(","):
        ps = data[d]["calib"]
        changed = sum(strip(t) != t for t in ps.a + ps.b)
        ends = sum(closing(a) != closing(b) for a, b in zip(ps.a, ps.b, strict=True))
        print(f"\n{d} calib: {len(ps)} pairs ({int(ps.label.sum())} duplicates); strip changes")
        print(f"  {changed} of {2 * len(ps)} texts; {ends} pairs close differently")
        restatements(ps, enc)
        raw_cos = None
        for name in args.normalisers.split(","):
            print(f" {name}:")
            cos = run(name, ps, enc, ver, raw_cos)
            raw_cos = cos if raw_cos is None else raw_cos


if __name__ == "__main__":
    main()
