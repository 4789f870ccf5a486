"""How much headroom is left for the verifier on QQP, measured on the calib parts only.

`LATENTGATE_BENCH_FULL=1 python -m bench.semantic_headroom` prints two tables:

1. Anatomy of the wrong top-1 hits per cosine band (labelled protocol): how many serve the pair's
   own entry although the pair is labelled non-duplicate, and how many serve another entry the
   labels do not join to the question (often an unlabelled duplicate). Both bound the precision
   any verifier can show on this data.
2. Context stacking: the shipped MLP's score alone against a logistic model over it plus where
   the candidate stands among its neighbours (cosine, the margin to the best other candidate,
   its rank), fitted out of fold on calib QQP + PAWS. Reported as the best labelled QQP precision
   at a recall floor, with and without the PAWS false-hit goal.
3. Ranking inside the shipped floor: among top-1 candidates over the shipped cosine floor, how
   well cosine, the MLP (restatements at 1.0), and logistic stacks of them with and without
   token alignment (BERTScore-like max-sim over MiniLM's contextual token vectors, which a
   cached entry would have to store) tell right hits from wrong: AUC and precision at fixed hit
   counts, out of fold on calib QQP.

The eval parts and the test splits are not read.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from bench.semantic_data import embedded_splits
from bench.semantic_pooled import (
    Pool,
    Scores,
    build_pool,
    choose_verified,
    label_roots,
    score,
    score_labelled,
)
from bench.train_verifier import PAWS_GOAL, pool_probs
from cache.semantic.verifier import MlpVerifier

BANDS = ((0.90, 0.94), (0.94, 0.97), (0.97, 1.01))
FOLDS = 5


def candidate_truth(pool: Pool, queries: list[str], roots: dict[str, str]) -> np.ndarray:
    """(n, k): 1 where serving that candidate is right under the labelled protocol."""
    n, k = pool.cand.shape
    out = np.zeros((n, k), np.float32)
    for i in range(n):
        q = roots.get(queries[i].lower(), "q")
        for j in range(k):
            c = int(pool.cand[i, j])
            own = c == pool.own[i] and pool.label[i] == 1
            out[i, j] = float(own or roots.get(pool.entries[c].lower(), "e") == q)
    return out


def anatomy(pool: Pool, truth: np.ndarray) -> None:
    print("wrong top-1 hits on QQP calib (labelled protocol)")
    print("band          hits  wrong  own pair labelled 0  other entry, not joined")
    for lo, hi in BANDS:
        band = (pool.cand_cos[:, 0] >= lo) & (pool.cand_cos[:, 0] < hi)
        wrong = band & (truth[:, 0] == 0)
        own = wrong & (pool.cand[:, 0] == pool.own)
        print(
            f"[{lo:.2f}, {min(hi, 1.0):.2f})  {int(band.sum()):5d}  {int(wrong.sum()):5d}"
            f"  {int(own.sum()):19d}  {int((wrong & ~own).sum()):23d}"
        )


def context_columns(cos: np.ndarray) -> list[np.ndarray]:
    n, k = cos.shape
    other = np.stack([np.delete(cos, j, axis=1).max(axis=1) for j in range(k)], axis=1)
    return [cos, np.clip(cos - other, -0.1, 0.1), np.tile(np.arange(k, dtype=np.float32), (n, 1))]


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1e-3, steps: int = 30) -> np.ndarray:
    """Newton's method; returns weights with the bias last."""
    xb = np.concatenate([x, np.ones((len(x), 1))], axis=1)
    w = np.zeros(xb.shape[1])
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(xb @ w)))
        grad = xb.T @ (p - y) + l2 * w
        hess = (xb * (p * (1 - p))[:, None]).T @ xb + l2 * np.eye(len(w))
        w -= np.linalg.solve(hess, grad)
    return w


def out_of_fold(
    columns: dict[str, list[np.ndarray]], truth: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    xs = {d: np.stack([c.reshape(-1) for c in cols], axis=1) for d, cols in columns.items()}
    mu = np.concatenate(list(xs.values())).mean(axis=0)
    sd = np.concatenate(list(xs.values())).std(axis=0) + 1e-6
    xs = {d: (x - mu) / sd for d, x in xs.items()}
    k = next(iter(truth.values())).shape[1]
    fold = {d: np.repeat(np.arange(len(t)) % FOLDS, k) for d, t in truth.items()}
    out = {d: np.zeros(len(x)) for d, x in xs.items()}
    for f in range(FOLDS):
        x = np.concatenate([xs[d][fold[d] != f] for d in xs])
        y = np.concatenate([truth[d].reshape(-1)[fold[d] != f] for d in xs])
        w = fit_logistic(x, y)
        for d in xs:
            xf = np.concatenate([xs[d][fold[d] == f], np.ones((int((fold[d] == f).sum()), 1))], 1)
            out[d][fold[d] == f] = 1.0 / (1.0 + np.exp(-(xf @ w)))
    return {d: p.reshape(truth[d].shape) for d, p in out.items()}


def best_points(
    name: str,
    pools: dict[str, Pool],
    probs: dict[str, np.ndarray],
    qqp_score: Callable[[np.ndarray], Scores],
) -> None:
    best: dict[tuple[str, float], tuple[float, float, float]] = {}
    for floor in (0.80, 0.85, 0.88, 0.90):
        for p_min in np.arange(0.05, 0.999, 0.005):
            chosen = choose_verified(pools["qqp"], probs["qqp"], floor, float(p_min), None)
            sq = qqp_score(chosen)
            paws = score(
                pools["paws"],
                choose_verified(pools["paws"], probs["paws"], floor, float(p_min), None),
            )
            if not sq.hits:
                continue
            for goal, ok in (
                ("any", True),
                (f"paws<={PAWS_GOAL:.0%}", paws.false_hit <= PAWS_GOAL),
            ):
                for r in (0.10, 0.20, 0.30):
                    if ok and sq.recall >= r and sq.precision > best.get((goal, r), (0.0,))[0]:
                        best[(goal, r)] = (sq.precision, sq.recall, paws.false_hit)
    for (goal, r), (p, rec, fh) in sorted(best.items()):
        print(
            f"{name:28s} {goal:10s} recall>={r:.2f}: precision {p:.3f} at {rec:.3f}, PAWS {fh:.3f}"
        )


def main() -> None:
    data, vecs = embedded_splits()
    verifier = MlpVerifier.load()
    roots = label_roots(data["qqp"]["train"], data["qqp"]["calib"])
    pools: dict[str, Pool] = {}
    mlp: dict[str, np.ndarray] = {}
    truth: dict[str, np.ndarray] = {}
    for d in ("qqp", "paws"):
        ps = data[d]["calib"]
        va, vb = vecs[(d, "calib")]
        pools[d] = build_pool(ps, va, vb)
        mlp[d] = pool_probs(verifier, ps, pools[d], vb)
        # PAWS has no label graph: only the pair's own entry can be right.
        truth[d] = candidate_truth(pools[d], ps.b, roots if d == "qqp" else {})
    queries = data["qqp"]["calib"].b
    anatomy(pools["qqp"], truth["qqp"])
    print()

    def labelled(chosen: np.ndarray) -> Scores:
        return score_labelled(pools["qqp"], chosen, queries, roots)

    logit = {
        d: np.log(np.clip(p, 1e-6, 1 - 1e-6) / np.clip(1 - p, 1e-6, 1)) for d, p in mlp.items()
    }
    best_points("cosine alone", pools, {d: p.cand_cos for d, p in pools.items()}, labelled)
    best_points("shipped MLP", pools, mlp, labelled)
    stacked = out_of_fold(
        {d: [logit[d], *context_columns(pools[d].cand_cos)] for d in pools}, truth
    )
    best_points("MLP + neighbour context", pools, stacked, labelled)
    print()
    inside_floor(pools["qqp"], queries, logit["qqp"], truth["qqp"], verifier.floor)


def token_vectors(texts: list[str]) -> list[np.ndarray]:
    """MiniLM's contextual token vectors per text (CLS and SEP dropped), unit length."""
    from sentence_transformers import SentenceTransformer

    from bench.semantic_data import model_path

    model = SentenceTransformer(model_path(), device="cpu")
    out = model.encode(texts, batch_size=128, output_value="token_embeddings")
    vecs = []
    for t in out:
        v = np.asarray(t)[1:-1] if len(t) > 2 else np.asarray(t)
        vecs.append(v / np.linalg.norm(v, axis=1, keepdims=True))
    return vecs


def alignment_columns(q: list[np.ndarray], e: list[np.ndarray]) -> np.ndarray:
    """Per pair: mean and min over each side's tokens of its best match on the other side."""
    rows = []
    for a, b in zip(q, e, strict=True):
        s = a @ b.T
        ra, rb = s.max(axis=1), s.max(axis=0)
        rows.append([ra.mean(), rb.mean(), ra.min(), rb.min()])
    return np.asarray(rows, np.float64)


def auc(score: np.ndarray, y: np.ndarray) -> float:
    """Mann-Whitney AUC (ties averaged)."""
    order = np.argsort(score, kind="stable")
    ranks = np.empty(len(score))
    ranks[order] = np.arange(1, len(score) + 1)
    for v in np.unique(score):
        tie = score == v
        ranks[tie] = ranks[tie].mean()
    pos = y == 1
    n1, n0 = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - n1 * (n1 + 1) / 2) / max(n1 * n0, 1))


def inside_floor(
    pool: Pool, queries: list[str], logit: np.ndarray, truth: np.ndarray, floor: float
) -> None:
    keep = np.flatnonzero(pool.cand_cos[:, 0] >= floor)
    y = truth[keep, 0]
    cos = pool.cand_cos[keep, 0].astype(np.float64)
    mlp = logit[keep, 0]
    ent = [pool.entries[int(pool.cand[i, 0])] for i in keep]
    align = alignment_columns(token_vectors([queries[i] for i in keep]), token_vectors(ent))
    fold = np.arange(len(keep)) % FOLDS

    def stack(x: np.ndarray) -> np.ndarray:
        x = (x - x.mean(axis=0)) / (x.std(axis=0) + 1e-9)
        out = np.zeros(len(x))
        for f in range(FOLDS):
            w = fit_logistic(x[fold != f], y[fold != f])
            out[fold == f] = x[fold == f] @ w[:-1]
        return out

    rankers = {
        "cosine": cos,
        "MLP (restated 1.0)": mlp,
        "stack: cosine + MLP": stack(np.column_stack([cos, mlp])),
        "stack: + token alignment": stack(np.column_stack([cos, mlp, align])),
    }
    n_dup = int((pool.label == 1).sum())
    sizes = [n for n in (150, 250, 400, 600) if n <= len(keep)]
    print(
        f"top-1 candidates at cosine >= {floor} on QQP calib: {len(keep)}, "
        f"{int(y.sum())} right (labelled protocol); precision at the top n (recall)"
    )
    for name, sc in rankers.items():
        top = np.argsort(-sc, kind="stable")
        cells = [f"n={n}: {y[top[:n]].mean():.3f} ({y[top[:n]].sum() / n_dup:.3f})" for n in sizes]
        print(f"  {name:26s} AUC {auc(sc, y):.3f}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
