"""Offline replay of the error-budget controller, for tuning on the calib parts only:
`python -m bench.semantic_budget_sim [--part calib]`.

The same BudgetGrid and audit rule as the gateway (cache.semantic.budget, cache.semantic.learn),
with sentence-transformers embeddings and labels from the pair classes (labelled duplicates share
an answer), no HTTP. The reported figures come from `bench.semantic_budget` through a real
gateway on the eval parts; this one is for choosing the controller's constants without looking
at them.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.budget_prior import scorer
from bench.semantic_data import MODEL_TAG, embed_cached, load_qqp, splits, st_encoder, unseen_spans
from bench.semantic_pooled import label_roots
from cache.semantic.budget import OPEN_LABELS, BudgetGrid, grid_edges
from cache.semantic.budget_prior import DEFAULT_PRIOR, Prior, load_prior
from cache.semantic.features import TextInfo, text_info
from cache.semantic.learn import AUDIT_CAP, LEARNING_LABELS
from cache.semantic.rivals import RIVAL_COSINE, contested
from cache.semantic.stage import TIGHTEN_STEP
from cache.semantic.verifier import DEFAULT_ARTIFACT, MlpVerifier, Verifier
from cache.settings import SemanticPolicy


@dataclass
class RouteSim:
    name: str
    grid: BudgetGrid | None
    audit_rate: float = 0.05
    scorer: Verifier | None = None  # a budgeted route's (bench.budget_prior.scorer)
    keys: list[int] = field(default_factory=list)  # request index of each entry
    bars: list[float] = field(default_factory=list)
    vecs: list[np.ndarray] = field(default_factory=list)
    infos: list[TextInfo] = field(default_factory=list)
    exact: dict[str, int] = field(default_factory=dict)
    hits: int = 0
    audits: int = 0
    credit: float = 0.0
    log: list[tuple[int, int]] = field(default_factory=list)  # per request: (hit, wrong)
    rival: float | None = RIVAL_COSINE  # cache.semantic.rivals


def run(
    texts: list[str],
    classes: list[str],
    vec: np.ndarray,
    ver: MlpVerifier,
    routes: list[RouteSim],
) -> None:
    spans = unseen_spans()  # as the serving stage builds them (Embedder.unseen)
    infos = [text_info(t, spans) for t in texts]
    for i, t in enumerate(texts):
        for r in routes:
            if t in r.exact:
                r.log.append((0, 0))
                continue
            hit_j = -1
            if r.vecs:
                cos_all = _mat(r) @ vec[i]
                top = np.argpartition(-cos_all, min(5, len(cos_all) - 1))[:5]
                top = top[np.argsort(-cos_all[top])]
                cos = cos_all[top]
                if cos.max() >= (ver.floor if r.scorer is None else r.scorer.floor):
                    cands = [r.infos[k] for k in top]
                    cvecs = _mat(r)[top]
                    if r.grid is None:
                        d = ver.choose(infos[i], vec[i], cands, cvecs, cos)
                        free = d.index >= 0 and not contested(cos, d.index, r.rival)
                        hit_j = int(top[d.index]) if free else -1
                    else:
                        hit_j = _budget(
                            r, i, classes, infos[i], vec[i], top, cos, cands, cvecs, r.scorer
                        )
            if hit_j >= 0:
                wrong = int(classes[r.keys[hit_j]] != classes[i])
                r.log.append((1, wrong))
                continue
            r.log.append((0, 0))
            r.exact[t] = len(r.keys)
            r.keys.append(i)
            r.bars.append(0.0)
            r.vecs.append(vec[i])
            r.infos.append(infos[i])


def _mat(r: RouteSim) -> np.ndarray:
    """The entries' vectors, grown in place (a restack per store would be quadratic)."""
    buf = getattr(r, "_buf", None)
    filled = getattr(r, "_filled", 0)
    n = len(r.vecs)
    if buf is None or len(buf) < n:
        grown = np.zeros((max(1024, 2 * n), r.vecs[0].shape[0]), np.float32)
        if buf is not None:
            grown[:filled] = buf[:filled]
        buf = grown
        r._buf = buf  # type: ignore[attr-defined]
    for k in range(filled, n):
        buf[k] = r.vecs[k]
    r._filled = n  # type: ignore[attr-defined]
    return buf[:n]


def _budget(r, i, classes, info, v, top, cos, cands, cvecs, ver) -> int:  # type: ignore[no-untyped-def]
    g = r.grid
    score = ver.scores(info, v, cands, cvecs, cos)
    free = np.array([not contested(cos, x, r.rival) for x in range(len(cos))])
    score = np.where(free, score, -1.0)
    best = int(np.argmax(score))
    if score[best] < 0:
        return -1  # contested: neither served nor labelled (cache.semantic.stage.search)
    g.observe(float(cos[best]), float(score[best]))
    bar = g.bar()
    for k in np.argsort(-score, kind="stable").tolist():
        c, p = float(cos[k]), float(score[k])
        j = int(top[k])
        if p >= 0 and bar.serves(c, p) and p >= r.bars[j]:
            r.hits += 1
            rate = r.audit_rate
            if bar.labels < LEARNING_LABELS:
                rate = min(AUDIT_CAP, 2 * rate)
            r.credit += rate
            if r.credit >= 1.0 - 1e-9 and r.audits + 1 <= AUDIT_CAP * r.hits + 1e-9:
                r.credit -= 1.0
                r.audits += 1
                agree = classes[r.keys[j]] == classes[i]
                g.label(c, p, agree)
                if not agree:
                    r.bars[j] = max(r.bars[j], p + TIGHTEN_STEP)
            return j
    c, p, j = float(cos[best]), float(score[best]), int(top[best])
    if p >= 0:
        agree = classes[r.keys[j]] == classes[i]
        g.label(c, p, agree)
        if not agree and bar.serves(c, p):
            r.bars[j] = max(r.bars[j], p + TIGHTEN_STEP)
    return -1


def budget_routes(
    ver: MlpVerifier,
    budgets: tuple[float, ...],
    delta: float,
    min_labels: int,
    prior: Prior | None,
    shift: bool = True,
    open_labels: int = OPEN_LABELS,
) -> list[RouteSim]:
    """The static point, then one budgeted route per budget, built as cache.semantic.setup
    builds them (scoring from the learning floor, serving from the shipped point)."""
    sc = scorer(ver)
    return [RouteSim("static", None)] + [
        RouteSim(
            f"budget {b}",
            BudgetGrid(
                b,
                sc.floor,
                ver.p_min,
                delta=delta,
                min_labels=min_labels,
                prior=prior,
                serve_floor=ver.floor,
                shift=shift,
                open_labels=open_labels,
            ),
            scorer=sc,
        )
        for b in budgets
    ]


def summary(r: RouteSim, half: int) -> str:
    log = np.asarray(r.log)
    second = log[half:]
    hits, wrong = int(second[:, 0].sum()), int(second[:, 1].sum())
    err = wrong / hits if hits else float("nan")
    return (
        f"  {r.name:<10} second half: hits {hits:>4} ({hits / len(second):.3f}) error {err:.3f}"
        f"  | audits {r.audits} of {r.hits} hits"
    )


def streams(part: str, dev_roots: bool = False) -> list[tuple[str, list[str], list[str]]]:
    data = splits()
    qroots = label_roots(load_qqp()) if dev_roots else None
    out = []
    for d in ("qqp", "paws", "stsb"):
        ps = data[d][part if d != "stsb" or part != "eval" else "eval"]
        roots = qroots if d == "qqp" and qroots is not None else label_roots(ps)
        texts = ps.a + ps.b
        out.append((f"{d}-{part}", texts, [roots.get(t.lower(), t.lower()) for t in texts]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--part", default="calib")
    policy = SemanticPolicy()
    ap.add_argument("--delta", type=float, default=round(1 - policy.error_confidence, 6))
    ap.add_argument("--min-labels", type=int, default=policy.min_labels)
    ap.add_argument("--prior", default=str(DEFAULT_PRIOR), help="'none': live labels only")
    ap.add_argument("--audit-rate", type=float, default=0.05)
    ap.add_argument("--streams", default="qqp,paws,stsb")
    ap.add_argument("--no-shift", action="store_true", help="trust the prior's rates as they are")
    ap.add_argument(
        "--roots",
        choices=("part", "dev"),
        default="part",
        help="QQP classes from the part's own labels (as held-out streams) or all dev labels",
    )
    ap.add_argument("--rival", default=str(RIVAL_COSINE), help="'none': no contested rule")
    args = ap.parse_args()
    rival = None if args.rival == "none" else float(args.rival)
    ver = MlpVerifier.load()
    sc = scorer(ver)
    cos_edges, score_edges = grid_edges(sc.floor, ver.p_min, ver.floor)
    prior = (
        None
        if args.prior == "none"
        else load_prior(Path(args.prior), DEFAULT_ARTIFACT, cos_edges, score_edges, rival)
    )
    enc = st_encoder()
    for name, texts, classes in streams(args.part, args.roots == "dev"):
        if name.split("-")[0] not in args.streams.split(","):
            continue
        vec = embed_cached(texts, enc, MODEL_TAG)
        routes = budget_routes(
            ver, (0.02, 0.05, 0.10), args.delta, args.min_labels, prior, not args.no_shift
        )
        for r in routes:
            r.audit_rate, r.rival = args.audit_rate, rival
        run(texts, classes, vec, ver, routes)
        print(f"{name}: {len(texts)} requests")
        for r in routes:
            print(summary(r, len(texts) // 2))
            if r.grid is not None:
                b = r.grid.bar()
                print(f"             bar {b}\n             looks like {r.grid.mixture()}")


if __name__ == "__main__":
    main()
