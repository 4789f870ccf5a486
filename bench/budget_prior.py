"""The error budget's prior: `python -m bench.budget_prior` writes cache/semantic/budget_prior.npz.

Replays the calib parts of QQP, PAWS and STS-B (the development data; full parts, never the eval
parts) as a stream, all first texts then all second texts, against a route that serves nothing:
every text is stored, and every lookup whose best candidate (by verifier score, as a budgeted
lookup picks it) is over the cosine floor gives one label, right when the candidate's class is
the asker's (labelled duplicates share a class). The counts per (cosine, score) cell, one table
per dataset and phase (first texts, second texts), are the prior of cache.semantic.budget
(cache.semantic.budget_prior says how they are mixed and weighted).

The counts depend on the verifier: rebuild with this one command after a new verifier.npz (the
artifact records the verifier file's digest and the gateway warns when they differ).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass

import numpy as np

from bench.semantic_data import (
    MODEL_TAG,
    embed_cached,
    load_qqp,
    splits,
    st_encoder,
    unseen_spans,
)
from bench.semantic_pooled import label_roots
from cache.semantic.budget import grid_edges
from cache.semantic.budget_prior import DEFAULT_PRIOR, digest
from cache.semantic.features import text_info
from cache.semantic.rivals import RIVAL_COSINE, contested
from cache.semantic.setup import budget_scorer
from cache.semantic.verifier import DEFAULT_ARTIFACT, MlpVerifier, Verifier

TOP_K = 5


@dataclass
class Records:
    """One row per lookup with a candidate over the floor: its cell, and whether it was right."""

    cosine: np.ndarray
    score: np.ndarray
    wrong: np.ndarray
    index: np.ndarray  # request position in the stream
    requests: int


def replay(
    texts: list[str],
    classes: list[str],
    vec: np.ndarray,
    ver: Verifier,
    rival: float | None = RIVAL_COSINE,
) -> Records:
    """ver: the verifier as a budgeted route scores with it (from its learning floor). Lookups
    whose candidates are all contested (cache.semantic.rivals) give no row: a route neither
    serves nor labels them."""
    spans = unseen_spans()  # as the serving stage builds them (Embedder.unseen)
    infos = [text_info(t, spans) for t in texts]
    buf = np.zeros((len(texts), vec.shape[1]), np.float32)
    owner: list[int] = []
    seen: set[str] = set()
    rows: list[tuple[float, float, int, int]] = []
    for i, t in enumerate(texts):
        if t in seen:
            continue  # an exact hit: no semantic lookup
        n = len(owner)
        if n:
            cos_all = buf[:n] @ vec[i]
            k = min(TOP_K, n)
            top = np.argpartition(-cos_all, k - 1)[:k]
            top = top[np.argsort(-cos_all[top])]
            cos = cos_all[top]
            if cos[0] >= ver.floor:
                sc = ver.scores(infos[i], vec[i], [infos[owner[j]] for j in top], buf[top], cos)
                free = np.array([not contested(cos, x, rival) for x in range(len(top))])
                sc = np.where(free, sc, -1.0)
                b = int(np.argmax(sc))
                if sc[b] >= 0:
                    wrong = int(classes[owner[int(top[b])]] != classes[i])
                    rows.append((float(cos[b]), float(sc[b]), wrong, i))
        seen.add(t)
        buf[n] = vec[i]
        owner.append(i)
    a = np.asarray(rows, np.float64).reshape(-1, 4)
    return Records(a[:, 0], a[:, 1], a[:, 2].astype(int), a[:, 3].astype(int), len(texts))


def calib_streams(dev_roots: bool = False) -> list[tuple[str, list[str], list[str]]]:
    """Classes from each part's own labels (as a held-out stream has them); dev_roots: QQP's
    from every labelled edge of the 40,000 dev pairs, which joins more questions."""
    data = splits()
    qroots = label_roots(load_qqp()) if dev_roots else None
    out = []
    for d in ("qqp", "paws", "stsb"):
        ps = data[d]["calib"]
        roots = qroots if d == "qqp" and qroots is not None else label_roots(ps)
        texts = ps.a + ps.b
        out.append((d, texts, [roots.get(t.lower(), t.lower()) for t in texts]))
    return out


def scorer(ver: MlpVerifier) -> Verifier:
    """As cache.semantic.setup builds a budgeted route's: scoring from the learning floor."""
    return budget_scorer(ver)


def records(
    ver: Verifier, dev_roots: bool = False, rival: float | None = RIVAL_COSINE
) -> dict[str, Records]:
    enc = st_encoder()
    out = {}
    for name, texts, classes in calib_streams(dev_roots):
        vec = embed_cached(texts, enc, MODEL_TAG)
        out[name] = replay(texts, classes, vec, ver, rival)
    return out


def counts(r: Records, cos_edges: np.ndarray, score_edges: np.ndarray) -> np.ndarray:
    """[phase, labels|wrong, cosine cell, score cell]: phase 0 the first texts (asked against
    each other), phase 1 the second texts."""
    out = np.zeros((2, 2, len(cos_edges), len(score_edges)))
    i = np.searchsorted(cos_edges, r.cosine, side="right") - 1
    j = np.searchsorted(score_edges, r.score, side="right") - 1
    phase = (r.index >= r.requests // 2).astype(int)
    ok = (i >= 0) & (j >= 0)
    np.add.at(out[:, 0], (phase[ok], i[ok], j[ok]), 1)
    np.add.at(out[:, 1], (phase[ok], i[ok], j[ok]), r.wrong[ok])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=str(DEFAULT_PRIOR))
    ap.add_argument(
        "--roots",
        choices=("part", "dev"),
        default="part",
        help="which labels join QQP questions into classes: the calib part's own (as a held-out"
        " stream's are) or every edge of the 40,000 QQP dev pairs",
    )
    ap.add_argument(
        "--rival", default=str(RIVAL_COSINE), help="the routes' rival_cosine ('none': off)"
    )
    args = ap.parse_args()
    rival = None if args.rival == "none" else float(args.rival)
    os.environ["LATENTGATE_BENCH_FULL"] = "1"  # the whole calib parts, always
    ver = MlpVerifier.load()
    # The grid a budgeted route of this verifier uses.
    cos_edges, score_edges = grid_edges(scorer(ver).floor, ver.p_min, ver.floor)
    recs = records(scorer(ver), args.roots == "dev", rival)
    tables = {}
    for name, r in recs.items():
        tables[name] = counts(r, cos_edges, score_edges)
        print(
            f"{name}: {r.requests} requests, {len(r.wrong)} labels, "
            f"{int(r.wrong.sum())} wrong ({r.wrong.mean():.3f})"
        )
    meta = {
        "datasets": list(tables),
        "verifier_sha256": digest(DEFAULT_ARTIFACT),
        "command": f"python -m bench.budget_prior --roots {args.roots}",
        "rival_cosine": rival,
    }
    np.savez(
        args.out,
        cos_edges=cos_edges,
        score_edges=score_edges,
        counts=np.stack([tables[n] for n in tables]),
        meta=np.asarray(json.dumps(meta)),
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
