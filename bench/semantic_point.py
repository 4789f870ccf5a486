"""The shipped operating point against cosine alone: `python -m bench.semantic_point`.

The default point (cosine floor, verifier score) must not be dominated by plain cosine: at its
recall, its QQP precision (labelled protocol) must be >= cosine's, with PAWS non-paraphrase hits
(labelled protocol too) <= 2 % (one-sided 95 % Wilson bound, as bench.train_verifier). The point
is chosen on the calib parts only: among (floor, score) pairs that pass PAWS and reach recall
>= MIN_RECALL, the one whose precision most exceeds cosine's precision at the same recall (its
margin). Then the eval parts are scored, never used to choose. `--write` stores the chosen point
in the artifact's meta (cache/semantic/verifier.npz), which is what routes serve by default.
The labelled protocol joins a hit to its question through the part's own labels by default, as
`bench.semantic_eval --pairs` scores held-out files; `--roots dev` uses every QQP dev edge.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from bench.semantic_data import MODEL_TAG, PairSet, embed_cached, load_qqp, splits, st_encoder
from bench.semantic_pooled import (
    Pool,
    build_pool,
    choose_cosine,
    choose_verified,
    label_roots,
    score,
    score_labelled,
)
from bench.train_verifier import PAWS_GOAL, pool_probs, rate_upper_bound
from cache.semantic.verifier import DEFAULT_ARTIFACT, MlpVerifier

FLOORS = tuple(round(x, 3) for x in np.arange(0.88, 0.995, 0.01))
SCORES = tuple(round(x, 3) for x in np.arange(0.20, 0.70, 0.01))
COSINES = tuple(round(x, 4) for x in np.arange(0.85, 0.999, 0.0025))
MIN_RECALL = 0.10


class Part:
    def __init__(self, name: str, ps: PairSet, ver: MlpVerifier, enc, roots) -> None:  # type: ignore[no-untyped-def]
        va, vb = embed_cached(ps.a, enc, MODEL_TAG), embed_cached(ps.b, enc, MODEL_TAG)
        self.name, self.ps, self.roots = name, ps, roots
        self.pool: Pool = build_pool(ps, va, vb)
        self.prob = pool_probs(ver, ps, self.pool, vb)

    def labelled(self, chosen: np.ndarray):  # type: ignore[no-untyped-def]
        return score_labelled(self.pool, chosen, self.ps.b, self.roots)

    def cosine_curve(self) -> list[tuple[float, float, float]]:
        """(recall, precision, threshold) of cosine alone."""
        out = []
        for c in COSINES:
            s = self.labelled(choose_cosine(self.pool, c))
            if s.hits:
                out.append((s.recall, s.precision, c))
        return out

    def paws_false_hits(self, floor: float, p: float) -> tuple[int, int]:
        """Non-paraphrase hits by the labelled protocol: serving an entry whose text restates
        the query is right whichever pair it came from (the strict count calls it wrong)."""
        s = self.labelled(choose_verified(self.pool, self.prob, floor, p))
        neg = int((self.pool.label == 0).sum())
        return round(s.false_hit * neg), neg


def cosine_at(curve: list[tuple[float, float, float]], recall: float) -> float:
    """Cosine's best precision at recall >= `recall` (its precision at that recall)."""
    ok = [p for r, p, _ in curve if r >= recall]
    return max(ok) if ok else 0.0


def choose(
    qqp: Part, paws: Part, min_recall: float = MIN_RECALL
) -> tuple[float, float, dict[str, float]]:
    curve = qqp.cosine_curve()
    best: tuple[float, float, float, dict[str, float]] | None = None
    rows = []
    for floor in FLOORS:
        for p in SCORES:
            s = qqp.labelled(choose_verified(qqp.pool, qqp.prob, floor, p))
            if not s.hits or s.recall < min_recall:
                continue
            fh, neg = paws.paws_false_hits(floor, p)
            if rate_upper_bound(fh, neg) > PAWS_GOAL:
                continue
            margin = s.precision - cosine_at(curve, s.recall)
            row = {"precision": s.precision, "recall": s.recall, "margin": margin, "paws": fh / neg}
            rows.append((margin, floor, p, s.precision, s.recall))
            if best is None or margin > best[0]:
                best = (margin, floor, p, row)
    print("calib, best margins over cosine (margin, floor, score, precision, recall):")
    for r in sorted(rows, reverse=True)[:8]:
        print("  " + "  ".join(f"{x:.3f}" for x in r))
    if best is None:
        raise SystemExit("no point passes PAWS with recall >= min_recall on calib")
    return best[1], best[2], best[3]


def report(part: Part, floor: float, p: float, label: str) -> dict[str, float]:
    s = part.labelled(choose_verified(part.pool, part.prob, floor, p))
    strict = score(part.pool, choose_verified(part.pool, part.prob, floor, p))
    cos = cosine_at(part.cosine_curve(), s.recall)
    print(
        f"  {label:<28} {part.name:<6} labelled P {s.precision:.3f} R {s.recall:.3f} "
        f"(cosine at that recall: P {cos:.3f}) false-hit {s.false_hit:.3f} "
        f"(strict {strict.false_hit:.3f}) hits {s.hits}"
    )
    return {
        "precision": s.precision,
        "recall": s.recall,
        "cosine_precision": cos,
        "false_hit": s.false_hit,
        "strict_false_hit": strict.false_hit,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", action="store_true", help="store the point in verifier.npz")
    ap.add_argument("--min-recall", type=float, default=MIN_RECALL)
    ap.add_argument(
        "--roots",
        choices=("part", "dev"),
        default="part",
        help="which labels join a hit to its question: the part's own (what `bench.semantic_eval"
        " --pairs` and held-out scoring use), or every edge of the 40,000 QQP dev pairs",
    )
    args = ap.parse_args()
    ver = MlpVerifier.load()
    data = splits()
    enc = st_encoder()
    qroots = label_roots(load_qqp()) if args.roots == "dev" else None
    print(f"labelled protocol: {args.roots} labels join hits to questions")
    parts = {
        (d, s): Part(
            d,
            data[d][s],
            ver,
            enc,
            qroots if d == "qqp" and qroots is not None else label_roots(data[d][s]),
        )
        for d in ("qqp", "paws")
        for s in ("calib", "eval")
    }
    floor, p, row = choose(parts[("qqp", "calib")], parts[("paws", "calib")], args.min_recall)
    print(f"chosen on calib: floor {floor} score >= {p}: {json.dumps(row)}")
    out = {}
    for (d, s), part in parts.items():
        out[f"{d}/{s}/shipped"] = report(
            part, ver.floor, ver.p_min, f"{s} shipped ({ver.floor}, {ver.p_min})"
        )
        out[f"{d}/{s}/chosen"] = report(part, floor, p, f"{s} chosen ({floor}, {p})")
    if args.write:
        write_point(DEFAULT_ARTIFACT, floor, p)
        print(f"wrote floor {floor}, p_min {p} into {DEFAULT_ARTIFACT}")


def write_point(path: Path, floor: float, p_min: float) -> None:
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays["meta"]))
    meta["trained_point"] = meta.get(
        "trained_point", {"floor": meta["floor"], "p_min": meta["p_min"]}
    )
    meta["floor"], meta["p_min"] = floor, p_min
    meta["point_rule"] = "bench.semantic_point: not dominated by cosine on QQP calib, PAWS <= 2 %"
    arrays["meta"] = np.asarray(json.dumps(meta, sort_keys=True))
    np.savez_compressed(path, **arrays)


if __name__ == "__main__":
    main()
