"""Train the semantic verifier: `python -m bench.train_verifier` writes cache/semantic/verifier.npz.

Trains on the development splits only (QQP dev train part, PAWS dev train part, STS-B train part)
plus pooled hard negatives (each second text's nearest other first texts) and, with
`--swap-negatives N`, synthetic word-swap non-duplicates (bench.swap_negatives); chooses the
operating point (cosine floor, p_min) on the held-back calib parts: PAWS non-duplicate hits <=
PAWS_GOAL at 95 % confidence, then the first QQP goal in GOALS that calib reaches (most recall
there), else the most QQP precision. The idf table of the lexical features is fitted on the
training texts only and stored in the artifact. Deterministic (seeded).
`LATENTGATE_BENCH_FULL=1` trains on every dev pair.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from bench.semantic_data import MODEL_TAG, PairSet, embed_cached, embedded_splits, st_encoder
from bench.semantic_pooled import (
    Pool,
    Scores,
    build_pool,
    choose_verified,
    label_roots,
    restated,
    score,
    score_labelled,
)
from bench.swap_negatives import swap_pairs
from cache.semantic.features import FEATURES_VERSION, N_LEXICAL, Idf, pair_features, text_info
from cache.semantic.verifier import DEFAULT_ARTIFACT, MlpVerifier, build_matrix

PAWS_GOAL = 0.02
# The PAWS goal must hold for the one-sided 95 % upper bound of the calib false-hit rate, not
# the rate itself: calib has 290 non-paraphrases, so 5 hits (1.7 %) is compatible with a true
# rate of 4 % (the shipped v2 point did that, and its eval part showed 3.1 %). 1 hit in 290
# passes (bound 1.5 %), 2 do not (2.1 %).
PAWS_CONFIDENCE_Z = 1.645
# (QQP calib precision, min recall), first reachable wins; a wrong hit is worse than a miss, so
# after the target (0.95 at 0.30) come precision-first fallbacks with a little slack
# over 0.90 for calib noise.
GOALS = ((0.95, 0.30), (0.93, 0.10), (0.90, 0.10))
MIN_RECALL = 0.10
PRECISION_GOAL = GOALS[0][0]
HARD_NEG_K = 5
HARD_NEG_COS = 0.55


def pair_matrix(
    a: list[str], b: list[str], va: np.ndarray, vb: np.ndarray, idf: Idf | None
) -> np.ndarray:
    infos: dict[str, object] = {}

    def info(t: str):  # type: ignore[no-untyped-def]
        if t not in infos:
            infos[t] = text_info(t)
        return infos[t]

    lex = np.stack([pair_features(info(x), info(y), idf) for x, y in zip(a, b, strict=True)])
    cos = np.sum(va * vb, axis=1)
    return build_matrix(cos, lex, va, vb)


def training_rows(
    ps: PairSet,
    va: np.ndarray,
    vb: np.ndarray,
    idf: Idf,
    hard_k: int = HARD_NEG_K,
    graph: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Labelled pairs plus pooled hard negatives (another pair's first text near a second text).
    A pooled pair is labelled from the part's own labels: the pair itself, else (graph=True)
    whether a chain of labelled duplicates joins the two texts (QQP repeats questions across
    pairs: calling those "negatives" teaches the model to refuse right answers), else 0."""
    x = [pair_matrix(ps.a, ps.b, va, vb, idf)]
    y = [ps.label.astype(np.float32)]
    if hard_k <= 0:
        return x[0], y[0]
    pool = build_pool(ps, va, vb, k=hard_k)
    known = {(a, b): int(lab) for a, b, lab in zip(ps.a, ps.b, ps.label, strict=True)}
    roots = label_roots(ps) if graph else {}
    ha, hb, hy, hva, hvb = [], [], [], [], []
    for i in range(len(ps)):
        for j, c in zip(pool.cand[i], pool.cand_cos[i], strict=True):
            if j == pool.own[i] or c < HARD_NEG_COS:
                continue
            text = pool.entries[j]
            lab = known.get((text, ps.b[i]), known.get((ps.b[i], text), -1))
            if lab < 0:
                same = roots.get(text.lower(), "a") == roots.get(ps.b[i].lower(), "b")
                lab = int(graph and same)
            ha.append(text)
            hb.append(ps.b[i])
            hy.append(lab)
            hva.append(pool.entry_vecs[j])
            hvb.append(vb[i])
    if ha:
        x.append(pair_matrix(ha, hb, np.stack(hva), np.stack(hvb), idf))
        y.append(np.asarray(hy, np.float32))
    return np.concatenate(x), np.concatenate(y)


def train_mlp(
    x: np.ndarray, y: np.ndarray, hidden: int, epochs: int, seed: int
) -> dict[str, np.ndarray]:
    import torch

    torch.manual_seed(seed)
    mean = x.mean(axis=0)
    std = x.std(axis=0) + 1e-4
    xt = torch.from_numpy((x - mean) / std)
    yt = torch.from_numpy(y)
    net = torch.nn.Sequential(
        torch.nn.Dropout(0.1),
        torch.nn.Linear(x.shape[1], hidden),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.2),
        torch.nn.Linear(hidden, 1),
    )
    opt = torch.optim.AdamW(net.parameters(), lr=2e-3, weight_decay=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        net.train()
        perm = torch.randperm(len(xt), generator=gen)
        for s in range(0, len(xt), 256):
            idx = perm[s : s + 256]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                net(xt[idx]).squeeze(1), yt[idx]
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
        sched.step()
    lin1, lin2 = net[1], net[4]
    return {
        "w1": lin1.weight.detach().numpy().T.copy(),
        "b1": lin1.bias.detach().numpy().copy(),
        "w2": lin2.weight.detach().numpy().reshape(-1, 1).copy(),
        "b2": lin2.bias.detach().numpy().copy(),
        "mean": mean.astype(np.float32),
        "std": std.astype(np.float32),
    }


def pool_probs(ver: MlpVerifier, ps: PairSet, pool: Pool, vb: np.ndarray) -> np.ndarray:
    n, k = pool.cand.shape
    a = [pool.entries[j] for j in pool.cand.reshape(-1)]
    b = [t for t in ps.b for _ in range(k)]
    va = pool.entry_vecs[pool.cand.reshape(-1)]
    vbb = np.repeat(vb, k, axis=0)
    prob = ver.probabilities(pair_matrix(a, b, va, vbb, ver.idf)).reshape(n, k)
    return restated(pool, ps.b, prob)


def rate_upper_bound(hits: int, n: int, z: float = PAWS_CONFIDENCE_Z) -> float:
    """Wilson score upper bound of a rate observed as hits / n."""
    if n <= 0:
        return 1.0
    p = hits / n
    centre = p + z * z / (2 * n)
    spread = z * float(np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)))
    return (centre + spread) / (1 + z * z / n)


def choose_point(
    curves: dict[str, tuple[Pool, np.ndarray]],
    p_grid: np.ndarray | None = None,
    labelled: tuple[list[str], dict[str, str]] | None = None,
) -> tuple[float, float, dict[str, object], tuple[int, float]]:
    """PAWS false hits <= PAWS_GOAL first (their 95 % upper bound: `rate_upper_bound`). Then
    the first of GOALS that calib reaches, with the most QQP recall there; else the most QQP
    precision with recall >= MIN_RECALL. Returns the point, its calib report and a rank (higher
    = better) to compare models. `labelled` (the QQP queries and a label graph) scores QQP by
    the labelled protocol instead of the strict one (bench.semantic_pooled.score_labelled)."""
    qpool, qprob = curves["qqp"]
    ppool, pprob = curves["paws"]
    paws_negatives = int((ppool.label == 0).sum())

    def qqp_score(chosen: np.ndarray) -> Scores:
        if labelled is None:
            return score(qpool, chosen)
        return score_labelled(qpool, chosen, labelled[0], labelled[1])

    tiers: list[list[tuple[float, float, float]]] = [[] for _ in GOALS]
    fallback: list[tuple[float, float, float]] = []
    for floor in (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.88, 0.9):
        for p_min in np.arange(0.30, 0.999, 0.005) if p_grid is None else p_grid:
            sq = qqp_score(choose_verified(qpool, qprob, floor, float(p_min), rival=None))
            if not sq.hits or sq.recall < MIN_RECALL:
                continue
            sp = score(ppool, choose_verified(ppool, pprob, floor, float(p_min), rival=None))
            paws_hits = round(sp.false_hit * paws_negatives)
            if rate_upper_bound(paws_hits, paws_negatives) > PAWS_GOAL:
                continue
            for t, (prec, rec) in enumerate(GOALS):
                if sq.precision >= prec and sq.recall >= rec:
                    tiers[t].append((sq.recall, floor, round(float(p_min), 3)))
                    break
            else:
                fallback.append((sq.precision, floor, round(float(p_min), 3)))
    rank: tuple[int, float] = (-1, 0.0)
    floor, p_min = 0.85, 0.99
    for t, got in enumerate(tiers):
        if got:
            best = max(got)
            rank, floor, p_min = (len(GOALS) - t, best[0]), best[1], best[2]
            break
    else:
        if fallback:
            best = max(fallback)
            rank, floor, p_min = (0, best[0]), best[1], best[2]
    report = {
        name: score(pool, choose_verified(pool, prob, floor, p_min, rival=None)).__dict__
        for name, (pool, prob) in curves.items()
    }
    if labelled is not None:
        report["qqp_labelled"] = qqp_score(
            choose_verified(qpool, qprob, floor, p_min, rival=None)
        ).__dict__
    return floor, p_min, report, rank


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=DEFAULT_ARTIFACT)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--train-on",
        default="qqp,paws",
        help="development sets whose training parts train the model (stsb: optional;"
        " on small QQP samples it lowered QQP precision on calib)",
    )
    ap.add_argument("--inputs", default="full,lexical", help="input sets to try; calib decides")
    ap.add_argument("--hard-neg-k", type=int, default=HARD_NEG_K, help="pooled hard negatives")
    ap.add_argument(
        "--paws-weight",
        type=int,
        default=1,
        help="repeat PAWS training rows this often (20 was tried on the full dev data: calib"
        " got worse on both QQP precision and PAWS false hits)",
    )

    ap.add_argument(
        "--protocol",
        choices=("labelled", "strict"),
        default="strict",
        help="how calib scores QQP hits when choosing the operating point: labelled = a hit on"
        " another entry is right when the labels join the two questions (the issue's cosine"
        " baselines match this protocol); strict = only the pair's own entry",
    )
    ap.add_argument(
        "--hard-neg-labels",
        choices=("graph", "pair"),
        default="pair",
        help="label pooled hard negatives through the training part's duplicate graph, or only"
        " by their own pair label (v2's way: unlabelled duplicates count as negatives)",
    )
    ap.add_argument(
        "--swap-negatives",
        type=int,
        default=4000,
        help="add up to N synthetic word-swap non-duplicates made from the QQP and STS-B"
        " training texts (bench.swap_negatives); calib ranked 2000/4000/8000 and chose 4000;"
        " with 0 no operating point passes the PAWS goal at 95 %% confidence",
    )
    args = ap.parse_args()
    t0 = time.perf_counter()
    data, vecs = embedded_splits()
    print(f"embedded in {time.perf_counter() - t0:.0f}s")
    # idf from the training texts of every development set (never calib or eval)
    train_texts = sorted({t for d in data for t in data[d]["train"].a + data[d]["train"].b})
    idf = Idf.fit(train_texts)
    print(f"idf: {len(idf.table)} words from {len(train_texts)} training texts")
    xs, ys = [], []
    for d in args.train_on.split(","):
        x, y = training_rows(
            data[d]["train"],
            *vecs[(d, "train")],
            idf,
            args.hard_neg_k,
            graph=args.hard_neg_labels == "graph",
        )
        print(f"{d}: {len(y)} training rows ({int(y.sum())} positive)")
        rep = args.paws_weight if d == "paws" else 1
        xs.append(np.tile(x, (rep, 1)))
        ys.append(np.tile(y, rep))
    if args.swap_negatives:
        texts = [t for d in ("qqp", "stsb") for t in data[d]["train"].a + data[d]["train"].b]
        swaps = swap_pairs(texts, args.swap_negatives, args.seed)
        enc = st_encoder()
        sa = embed_cached([a for a, _ in swaps], enc, MODEL_TAG)
        sb = embed_cached([b for _, b in swaps], enc, MODEL_TAG)
        xs.append(pair_matrix([a for a, _ in swaps], [b for _, b in swaps], sa, sb, idf))
        ys.append(np.zeros(len(swaps), np.float32))
        print(f"swap negatives: {len(swaps)} rows")
    x_all, y_all = np.concatenate(xs), np.concatenate(ys)
    calib = {}
    for d in ("qqp", "paws", "stsb"):
        ps = data[d]["calib"]
        va, vb = vecs[(d, "calib")]
        calib[d] = (ps, build_pool(ps, va, vb), vb)
    # The labelled protocol on calib joins questions through train and calib labels only.
    labelled = None
    if args.protocol == "labelled":
        roots = label_roots(data["qqp"]["train"], data["qqp"]["calib"])
        labelled = (data["qqp"]["calib"].b, roots)
    best: (
        tuple[tuple[int, float], dict[str, np.ndarray], float, float, dict[str, object], str] | None
    ) = None
    # Two input sets: everything (cosine + lexical + u*v, |u-v|) and the low-dimensional prefix
    # (cosine + lexical), which overfits less on small training sets. Calib decides.
    sets = {"full": x_all.shape[1], "lexical": 1 + N_LEXICAL}
    for inputs in args.inputs.split(","):
        n_in = sets[inputs]
        arrays = train_mlp(x_all[:, :n_in], y_all, args.hidden, args.epochs, args.seed)
        arrays.update(idf.arrays())
        meta = {
            "features_version": FEATURES_VERSION,
            "model": MODEL_TAG,
            "floor": 0.5,
            "p_min": 0.5,
        }
        ver = MlpVerifier(arrays, meta)
        curves = {d: (pool, pool_probs(ver, ps, pool, vb)) for d, (ps, pool, vb) in calib.items()}
        floor, p_min, report, rank = choose_point(curves, labelled=labelled)
        (qp, qpr), (pp, ppr) = curves["qqp"], curves["paws"]
        for pm in (0.5, 0.7, 0.8, 0.9, 0.95, 0.98):
            sq = score(qp, choose_verified(qp, qpr, 0.8, pm, rival=None))
            sp = score(pp, choose_verified(pp, ppr, 0.8, pm, rival=None))
            print(
                f"  calib floor 0.8 p>={pm}: qqp P {sq.precision:.3f} R {sq.recall:.3f}; "
                f"paws false-hit {sp.false_hit:.3f}"
            )
        print(f"inputs={inputs}: floor {floor} p_min {p_min:.3f} rank {rank}")
        print(f"  calib {json.dumps(report)}")
        if best is None or rank > best[0]:
            best = (rank, arrays, floor, p_min, report, inputs)
    assert best is not None
    _, arrays, floor, p_min, report, inputs = best
    meta = {"features_version": FEATURES_VERSION, "model": MODEL_TAG, "inputs": inputs}
    meta.update(
        floor=floor,
        p_min=p_min,
        calib=report,
        hidden=args.hidden,
        epochs=args.epochs,
        seed=args.seed,
        precision_goal=PRECISION_GOAL,
        goals=GOALS,
        paws_goal=PAWS_GOAL,
        paws_weight=args.paws_weight,
        swap_negatives=args.swap_negatives,
        protocol=args.protocol,
        hard_neg_labels=args.hard_neg_labels,
        trained_on=f"training parts of {args.train_on} (bench/semantic_data.py splits)",
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, meta=np.asarray(json.dumps(meta)), **arrays)
    print(json.dumps({"inputs": inputs, "floor": floor, "p_min": p_min, "calib": report}))
    print(
        f"wrote {args.out} ({args.out.stat().st_size // 1024} KiB) in "
        f"{time.perf_counter() - t0:.0f}s"
    )


if __name__ == "__main__":
    main()
