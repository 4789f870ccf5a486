"""Choosing the error budget's constants on the calib parts only: `python -m bench.budget_crossfit`.

Each calib part's pairs are cut in two halves. The prior is built from one half (the replay of
bench.budget_prior) and the controller is replayed on the other (bench.semantic_budget_sim's
route simulation), both ways, for each (error_confidence, min_labels) setting. A setting's
figures are never in-sample: the prior never saw the stream it is replayed on. The eval parts
are not read.

The rule a setting is judged by: pooled over the two replayed halves of each dataset (a half's
~80 hits put ±3 points of noise on its error rate), budget 0.10's error within 0.10 and budget
0.02's within 0.02; among those, the most budget-0.10 QQP hits, where counts within one
standard error of the most (sqrt of it) are ties that go to the higher confidence, then to
fewer min_labels: the stronger guarantee when the hits cannot tell settings apart (added in
the fifth session, before the eval parts were read, when 0.70 and 0.80 came 199 and 190).
(A first version of this rule
asked it of each half separately; no setting that served anything passed, the static point
included, so it was replaced by the pooled one. docs/benchmarks.md reports both.)
"""

from __future__ import annotations

import argparse
import itertools
import os

import numpy as np

from bench.budget_prior import counts, replay, scorer
from bench.semantic_budget_sim import RouteSim, budget_routes, run
from bench.semantic_data import MODEL_TAG, embed_cached, load_qqp, splits, st_encoder
from bench.semantic_pooled import label_roots
from cache.semantic.budget import OPEN_LABELS, grid_edges
from cache.semantic.budget_prior import Prior
from cache.semantic.verifier import MlpVerifier

Stream = tuple[list[str], list[str], np.ndarray]

BUDGETS = (0.02, 0.10)
DELTAS = (0.05, 0.1, 0.2, 0.3)
MIN_LABELS = (50, 100, 200)


def halves(
    dev_roots: bool = False, parts: tuple[str, ...] = ("calib",)
) -> dict[str, list[tuple[int, str, Stream]]]:
    """Per dataset, each part's two halves as streams: (fold, part, (texts, classes, vectors)).
    Fold h holds half h of every part. Classes from each half's own labels, as a held-out stream
    has them; dev_roots: QQP's from every labelled edge of the 40,000 dev pairs."""
    data = splits()
    qroots = label_roots(load_qqp()) if dev_roots else None
    enc = st_encoder()
    out: dict[str, list[tuple[int, str, Stream]]] = {}
    for d in ("qqp", "paws", "stsb"):
        out[d] = []
        for part in parts:
            ps = data[d][part]
            n = len(ps)
            va, vb = embed_cached(ps.a, enc, MODEL_TAG), embed_cached(ps.b, enc, MODEL_TAG)
            for h, (lo, hi) in enumerate(((0, n // 2), (n // 2, n))):
                texts = ps.a[lo:hi] + ps.b[lo:hi]
                roots = qroots if d == "qqp" and qroots else label_roots(ps.subset(range(lo, hi)))
                classes = [roots.get(t.lower(), t.lower()) for t in texts]
                out[d].append((h, part, (texts, classes, np.concatenate([va[lo:hi], vb[lo:hi]]))))
    return out


def second_half(r: RouteSim) -> tuple[int, int]:
    log = np.asarray(r.log)[len(r.log) // 2 :]
    return int(log[:, 0].sum()), int(log[:, 1].sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--deltas", default=",".join(map(str, DELTAS)), help="1 - error_confidence")
    ap.add_argument("--min-labels", default=",".join(map(str, MIN_LABELS)))
    ap.add_argument("--no-shift", action="store_true")
    ap.add_argument("--roots", choices=("part", "dev"), default="part")
    ap.add_argument(
        "--parts",
        default="calib",
        help="which parts' halves: calib (the eval parts unread), or calib,eval (fold h = half h"
        " of each; every stream is still replayed against the other fold's prior)",
    )
    ap.add_argument("--open-labels", type=int, default=OPEN_LABELS)
    args = ap.parse_args()
    deltas = [float(x) for x in args.deltas.split(",")]
    mins = [int(x) for x in args.min_labels.split(",")]
    os.environ["LATENTGATE_BENCH_FULL"] = "1"  # the whole calib parts, always
    ver = MlpVerifier.load()
    sc = scorer(ver)
    cos_edges, score_edges = grid_edges(sc.floor, ver.p_min, ver.floor)
    parts = halves(args.roots == "dev", tuple(args.parts.split(",")))
    # prior[h]: built from fold h (half h of every part) of every dataset
    priors = []
    for h in (0, 1):
        tables = [
            sum(counts(replay(*s, sc), cos_edges, score_edges) for f, _, s in parts[d] if f == h)
            for d in parts
        ]
        t = np.stack(tables)  # [d, phase, labels|wrong, i, j]
        priors.append(Prior(tuple(parts), t[:, :, 0], t[:, :, 1]))
    print(f"verifier point: floor {ver.floor}, score >= {ver.p_min}")
    print(
        "delta min_labels | per dataset, replayed half 0 / half 1: static hits/err; "
        + ", ".join(f"budget {b} hits/err" for b in BUDGETS)
    )
    results = {}
    for delta, min_labels in itertools.product(deltas, mins):
        row = {}
        for d in parts:
            for h, part, stream in parts[d]:
                routes = budget_routes(
                    ver,
                    BUDGETS,
                    delta,
                    min_labels,
                    priors[1 - h],
                    not args.no_shift,
                    args.open_labels,
                )
                run(*stream, ver, routes)
                row[(d, part, h)] = [second_half(r) for r in routes]
        results[(delta, min_labels)] = row
        cells = []
        for (d, part, h), figs in row.items():
            cells.append(
                f"{d}:{part}{h} " + " ".join(f"{n}/{(k / n if n else 0):.3f}" for n, k in figs)
            )
        print(f"{delta:<5} {min_labels:<4} | " + " | ".join(cells), flush=True)

    def ok(row: dict[tuple[str, str, int], list[tuple[int, int]]]) -> bool:
        for d in parts:
            for b, col in zip(BUDGETS, (1, 2), strict=True):
                n = sum(figs[col][0] for key, figs in row.items() if key[0] == d)
                k = sum(figs[col][1] for key, figs in row.items() if key[0] == d)
                if n and k / n > b:
                    return False
        return True

    def qqp(row: dict[tuple[str, str, int], list[tuple[int, int]]], col: int) -> int:
        return sum(figs[col][0] for key, figs in row.items() if key[0] == "qqp")

    passing = [(qqp(row, 2), key) for key, row in results.items() if ok(row)]
    static = qqp(results[next(iter(results))], 0)
    if passing:
        most = max(h for h, _ in passing)
        tied = [(h, key) for h, key in passing if h >= most - most**0.5]
        hits, (delta, min_labels) = min(tied, key=lambda t: (t[1][0], t[1][1]))
        print(
            f"chosen: error_confidence {1 - delta:.2f}, min_labels {min_labels} "
            f"({hits} QQP hits at budget 0.10 over both halves; static point {static})"
        )
    else:
        print("no setting keeps the pooled halves within their budgets")


if __name__ == "__main__":
    main()
