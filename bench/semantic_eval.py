"""Semantic cache evaluation, one command: `python -m bench.semantic_eval`.

Pooled (all first texts cached, every second text asked) on the held-back parts of every
labelled set in ../shared/data (QQP dev eval part, PAWS dev eval part, STS-B dev): precision of
hits, recall, false-hit rate on non-duplicates, for cosine alone (GPTCache's method) across
thresholds, the verifier across operating points, and GPTCache itself (its own venv) side by
side. Then lookup latency split into embed / search / verify, index search at 100k entries,
and hit rates on the query streams (banking77, clinc150, bing-covid).

`--pairs FILE` (repeatable) scores labelled pair files instead of the development eval parts:
held-out test splits or a team's own data, in any layout bench.semantic_data.load_pairs reads.
Nothing is trained or tuned on them; the CHOSEN row is the shipped operating point:

    python -m bench.semantic_eval --parts pooled --pairs qqp_test.jsonl.gz --pairs paws_test.tsv
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from bench.gptcache_run import gptcache_peer
from bench.semantic_data import (
    MODEL_TAG,
    PairSet,
    embed_cached,
    load_pairs,
    load_qqp,
    load_streams,
    splits,
    st_encoder,
    unseen_spans,
)
from bench.semantic_pooled import (
    Pool,
    build_pool,
    choose_cosine,
    choose_verified,
    label_roots,
    restated,
    score,
    score_labelled,
)
from bench.semantic_speed import latency, one_query_encoder, search_100k
from bench.train_cross_encoder import pool_scores
from bench.train_verifier import pool_probs
from cache.semantic.cross_encoder import DEFAULT_ARTIFACT as DEFAULT_CE
from cache.semantic.cross_encoder import CrossEncoder
from cache.semantic.features import text_info
from cache.semantic.rivals import RIVAL_COSINE, contested
from cache.semantic.verifier import DEFAULT_ARTIFACT as DEFAULT_FEATURES
from cache.semantic.verifier import CrossEncoderVerifier, MlpVerifier, Verifier

COSINES = (0.60, 0.80, 0.85, 0.90, 0.94, 0.96, 0.98)
P_MINS = (0.5, 0.7, 0.8, 0.9, 0.95, 0.97, 0.98)


def row(name: str, s: object) -> str:
    d = s.__dict__
    return (
        f"  {name:<34} precision {d['precision']:.3f}  recall {d['recall']:.3f}  "
        f"false-hit {d['false_hit']:.3f}  hits {d['hits']}"
    )


class Reporter:
    """Scores one choice of hits under both protocols, prints a row and keeps it."""

    def __init__(
        self, pool: Pool, queries: list[str], roots: dict[str, str], out: dict[str, object]
    ) -> None:
        self.pool, self.queries, self.roots, self.out = pool, queries, roots, out

    def __call__(self, name: str, chosen: np.ndarray) -> None:
        s = score(self.pool, chosen)
        g = score_labelled(self.pool, chosen, self.queries, self.roots)
        self.out[name] = {**s.__dict__, "labelled": g.__dict__}
        print(row(name, s) + f"  | P {g.precision:.3f} R {g.recall:.3f} FH {g.false_hit:.3f}")


FINE_COSINES = tuple(round(float(x), 4) for x in np.arange(0.85, 0.9991, 0.0025))


def against_cosine(
    pool: Pool, queries: list[str], roots: dict[str, str], point: object
) -> dict[str, float | bool]:
    """Is the point dominated by cosine alone (labelled protocol)? Cosine's best precision
    among thresholds (a 0.0025 sweep) whose recall is at least the point's."""
    lab = point["labelled"]  # type: ignore[index]
    best, at = float("nan"), float("nan")
    for c in FINE_COSINES:
        g = score_labelled(pool, choose_cosine(pool, c), queries, roots)
        if g.hits and g.recall >= lab["recall"] and not g.precision <= best:
            best, at = g.precision, c
    dominated = bool(best > lab["precision"])
    print(
        f"  {'cosine at that recall':<34} precision {best:.3f} (cosine>={at:g}): the point is "
        + ("DOMINATED by cosine" if dominated else "not dominated by cosine")
        + f" ({lab['precision'] - best:+.3f}, labelled protocol)"
    )
    return {"cosine_precision": best, "cosine_threshold": at, "dominated": dominated}


def candidate_probs(ver: Verifier, ps: PairSet, pool: Pool, vb: np.ndarray) -> np.ndarray:
    if isinstance(ver, MlpVerifier):
        return pool_probs(ver, ps, pool, vb)
    assert isinstance(ver, CrossEncoderVerifier) and ver.model is not None
    return restated(pool, ps.b, pool_scores(ver.model, ps, pool, min(0.7, ver.floor)))


def pooled(
    sets: dict[str, PairSet],
    enc,  # type: ignore[no-untyped-def]
    verifiers: dict[str, Verifier],
    gpt_limit: int,
    dev: bool = True,
    dev_roots: bool = False,
) -> dict[str, object]:
    """dev: the sets are the development eval parts (qqp, paws, stsb), else pair files."""
    results: dict[str, object] = {}
    for d, ps in sets.items():
        # Ground truth for the labelled protocol: the set's own duplicate edges, as for a
        # held-out file; with --roots dev, the QQP eval part joins through every labelled edge
        # of the 40,000 development pairs.
        roots = label_roots(load_qqp()) if dev_roots and d == "qqp" else label_roots(ps)
        va, vb = embed_cached(ps.a, enc, MODEL_TAG), embed_cached(ps.b, enc, MODEL_TAG)
        pool = build_pool(ps, va, vb)
        print(
            f"\n{d}: {len(ps)} pairs ({int(ps.label.sum())} duplicates), "
            f"{len(pool.entries)} cached entries; strict protocol | labelled protocol"
        )
        res: dict[str, object] = {}
        report = Reporter(pool, ps.b, roots, res)
        for c in COSINES:
            report(f"cosine>={c}", choose_cosine(pool, c))
        for vname, ver in verifiers.items():
            t = time.perf_counter()
            prob = candidate_probs(ver, ps, pool, vb)
            took = time.perf_counter() - t
            print(f"  ({vname}: scored the candidates in {took:.0f} s)")
            for p in P_MINS:
                report(f"{vname} p>={p}", choose_verified(pool, prob, ver.floor, p))
            name = f"{vname} CHOSEN (floor {ver.floor}, p>={ver.p_min:g})"
            report(name, choose_verified(pool, prob, ver.floor, ver.p_min))
            res[f"{vname} against cosine"] = against_cosine(pool, ps.b, roots, res[name])
        if gpt_limit and not (dev and d == "stsb"):
            g = gptcache_peer(ps, pool, gpt_limit)
            if g and "scores" in g:
                print(
                    row(f"GPTCache 0.1.44 t=0.8 (n={g['n']})", g["scores"])
                    + f"  lookup p50 {g['p50_ms']:.1f} ms p95 {g['p95_ms']:.1f} ms"
                )
                g["scores"] = g["scores"].__dict__
            else:
                print(f"  GPTCache: not run ({g}); cosine alone >= 0.60 is its default threshold")
            res["gptcache"] = g
        results[d] = res
    return results


def streams(enc, ver: Verifier, limit: int) -> dict[str, object]:  # type: ignore[no-untyped-def]
    out: dict[str, object] = {}
    print(f"\nquery streams (first {limit} queries each; a miss is cached):")
    spans = unseen_spans()  # as the serving stage builds them (Embedder.unseen)
    for st in load_streams(limit):
        vec = embed_cached(st.texts, enc, MODEL_TAG)
        norm = [
            " ".join("".join(c for c in t.lower() if c.isalnum() or c.isspace()).split())
            for t in st.texts
        ]
        for method in ("exact", "cosine>=0.90", "cosine>=0.60", "verifier"):
            seen: dict[str, int] = {}
            ev: list[int] = []
            infos = []
            hits = correct = 0
            for i, t in enumerate(st.texts):
                j = seen.get(norm[i], -1)
                if j < 0 and method != "exact" and ev:
                    sims = vec[ev] @ vec[i]
                    top = np.argsort(-sims)[:5]
                    if method.startswith("cosine"):
                        thr = float(method.split(">=")[1])
                        j = ev[top[0]] if sims[top[0]] >= thr else -1
                    else:
                        d = ver.choose(
                            text_info(t, spans),
                            vec[i],
                            [infos[k] for k in top],
                            vec[[ev[k] for k in top]],
                            sims[top],
                        )
                        # as a route serves: not while another entry is close too
                        free = d.index >= 0 and not contested(sims[top], d.index, RIVAL_COSINE)
                        j = ev[top[d.index]] if free else -1
                if j >= 0:
                    hits += 1
                    if st.labels is not None:
                        ok = st.labels[j] == st.labels[i] and st.labels[i] not in st.wrong_labels
                        correct += int(ok)
                else:
                    seen.setdefault(norm[i], i)
                    ev.append(i)
                    infos.append(text_info(t, spans))
            prec = correct / hits if hits and st.labels is not None else float("nan")
            out[f"{st.name}/{method}"] = {"hit_rate": hits / len(st.texts), "precision": prec}
            print(
                f"  {st.name:<14} {method:<13} hit rate {hits / len(st.texts):.3f}"
                + (f"  same-intent precision {prec:.3f}" if st.labels is not None else "")
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "--gptcache-pairs",
        type=int,
        default=2000,
        help="pairs per set given to GPTCache (its lookups are slow); 0 = skip",
    )
    ap.add_argument("--latency-queries", type=int, default=200)
    ap.add_argument("--stream-limit", type=int, default=800)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--artifact", type=Path, default=None, help="features .npz (default: shipped)")
    ap.add_argument("--ce-artifact", type=Path, default=None, help="cross-encoder .npz")
    ap.add_argument(
        "--verifiers",
        default=None,
        help="verifiers to score side by side (features, cross-encoder); latency and streams use"
        " the last. Default: features, and the cross-encoder when its artifact is there",
    )
    ap.add_argument(
        "--pairs",
        action="append",
        type=Path,
        default=[],
        help="a labelled pair file to score instead of the development eval parts (repeatable)",
    )
    ap.add_argument(
        "--roots",
        choices=("part", "dev"),
        default="part",
        help="labels joining a hit to its question: each set's own, or (dev eval parts only)"
        " every edge of the 40,000 QQP dev pairs",
    )
    ap.add_argument(
        "--parts",
        default="pooled,latency,search100k,streams",
        help="comma-separated subset of pooled,latency,search100k,streams",
    )
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    enc = st_encoder()
    verifiers: dict[str, Verifier] = {}
    ce_path = args.ce_artifact or DEFAULT_CE
    names = args.verifiers or ("features,cross-encoder" if ce_path.exists() else "features")
    for name in names.split(","):
        if name == "features":
            verifiers[name] = MlpVerifier.load(args.artifact or DEFAULT_FEATURES)
        elif name != "cross-encoder":
            raise SystemExit(f"unknown verifier {name!r}: features or cross-encoder")
        elif not ce_path.exists():
            raise SystemExit(
                f"no cross-encoder artifact at {ce_path}: train one with "
                "`python -m bench.train_cross_encoder`, or leave out --verifiers"
            )
        else:
            ce = CrossEncoder.load(ce_path)
            cv = CrossEncoderVerifier(ce.artifact, None, None)
            cv.attach(ce)
            verifiers[name] = cv
        v = verifiers[name]
        print(f"verifier {name}: floor {v.floor} p_min {v.p_min}")
    ver = list(verifiers.values())[-1]
    res: dict[str, object] = {}
    if "pooled" in parts:
        if args.pairs:
            stems = [f.name.split(".")[0] for f in args.pairs]
            unique = len(set(stems)) == len(stems)
            sets = {
                (s if unique else f.name): load_pairs(f)
                for s, f in zip(stems, args.pairs, strict=True)
            }
        else:
            sets = {d: parts_["eval"] for d, parts_ in splits().items()}
        res["pooled"] = pooled(
            sets,
            enc,
            verifiers,
            args.gptcache_pairs,
            dev=not args.pairs,
            dev_roots=args.roots == "dev" and not args.pairs,
        )
    data = splits() if parts - {"pooled"} else {}
    if "latency" in parts:
        res["latency_ms"] = latency(data, one_query_encoder(enc), ver, enc, args.latency_queries)
    if "search100k" in parts:
        print("\nindex search at 100k entries, CPU, one query at a time:")
        res["search_100k"] = search_100k(data, enc)
    if "streams" in parts:
        res["streams"] = streams(enc, ver, args.stream_limit)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, default=float), encoding="utf-8")


if __name__ == "__main__":
    main()
