"""Fine-tune the semantic cache's cross-encoder verifier from the packaged MiniLM weights.

    LATENTGATE_BENCH_FULL=1 python -m bench.train_cross_encoder          # train + calibrate
    LATENTGATE_BENCH_FULL=1 python -m bench.train_cross_encoder --calibrate-only

A cross-encoder reads the asked question and the cached one together, so attention compares
them word by word: the thing cosine over two separately pooled vectors cannot do ("2+3" vs
"2+4", swapped entities). The model is the bottom `--layers` transformer layers of the packaged
all-MiniLM-L6-v2 (fewer layers: less verify latency), mean pooling and one linear unit. The word
embeddings stay frozen, so the artifact holds only the trained layers (int8 per row) and the
head: 9.5 MB for 6 layers (not committed: see docs/benchmarks.md). `cache.semantic.cross_encoder`
rebuilds the model from the packaged weights plus this artifact and exports it to ONNX once.

Data: the development training parts only (bench/semantic_data.py splits): QQP dev train part,
plus pooled hard negatives (each second text's nearest other first texts; labelled from the
training part's own duplicate graph, else non-duplicate), plus PAWS dev train part. The
operating point (cosine floor, score bar) is chosen on the calib parts with the served ONNX
model (bench.train_verifier.choose_point's rule). Deterministic up to torch's CPU kernels.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np

from bench.semantic_data import PairSet, embedded_splits, model_path
from bench.semantic_pooled import Pool, build_pool, label_roots, restated
from bench.train_verifier import choose_point
from cache.semantic.cross_encoder import DEFAULT_ARTIFACT, CrossEncoder, save_artifact, update_meta

HARD_NEG_K = 2
HARD_NEG_COS = 0.75
MAX_TOKENS = 64


def training_pairs(
    ps: PairSet, va: np.ndarray, vb: np.ndarray, hard_k: int
) -> list[tuple[str, str, float]]:
    rows = [(a, b, float(y)) for a, b, y in zip(ps.a, ps.b, ps.label, strict=True)]
    if hard_k <= 0:
        return rows
    roots = label_roots(ps)
    pool = build_pool(ps, va, vb, k=hard_k + 1)
    seen = {(a, b) for a, b, _ in rows}
    for i in range(len(ps)):
        for j, c in zip(pool.cand[i], pool.cand_cos[i], strict=True):
            text = pool.entries[j]
            if j == pool.own[i] or c < HARD_NEG_COS or (text, ps.b[i]) in seen:
                continue
            seen.add((text, ps.b[i]))
            same = roots.get(text.lower(), text) == roots.get(ps.b[i].lower(), ps.b[i])
            rows.append((text, ps.b[i], 1.0 if same else 0.0))
    return rows


def pick_device(name: str) -> str:
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"training on {name}", flush=True)
    return name


def train(
    rows: list[tuple[str, str, float]],
    layers: int,
    epochs: int,
    lr: float,
    seed: int,
    device: str = "cpu",
) -> dict[str, np.ndarray]:
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModel

    torch.manual_seed(seed)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rng = random.Random(seed)
    tok = Tokenizer.from_file(str(Path(model_path()) / "tokenizer.json"))
    tok.enable_truncation(MAX_TOKENS)
    tok.no_padding()  # the packaged tokenizer pads to 128: batches pad to their longest
    bert = AutoModel.from_pretrained(
        model_path(), num_hidden_layers=layers, add_pooling_layer=False
    )
    for p in bert.embeddings.parameters():
        p.requires_grad = False
    bert.to(device)
    head = torch.nn.Linear(bert.config.hidden_size, 1).to(device)
    drop = torch.nn.Dropout(0.1)
    params = [p for p in bert.parameters() if p.requires_grad] + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    batch = 32
    steps = epochs * ((len(rows) + batch - 1) // batch)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warm, max(0.0, (steps - s) / (steps - warm)))
    )
    step, t0 = 0, time.perf_counter()
    for epoch in range(epochs):
        # Either order: the verifier must not care which side is the cached question.
        pairs = [(b, a, y) if rng.random() < 0.5 else (a, b, y) for a, b, y in rows]
        enc = tok.encode_batch([(a, b) for a, b, _ in pairs])
        # Length-bucketed batches (sorted chunks, shuffled): far less padding on a CPU.
        order = list(range(len(pairs)))
        rng.shuffle(order)
        chunks = [
            sorted(order[s : s + batch * 50], key=lambda i: len(enc[i].ids))
            for s in range(0, len(order), batch * 50)
        ]
        batches = [c[s : s + batch] for c in chunks for s in range(0, len(c), batch)]
        rng.shuffle(batches)
        bert.train()
        total = 0.0
        for n, idx in enumerate(batches):
            width = max(len(enc[i].ids) for i in idx)
            ids = torch.zeros((len(idx), width), dtype=torch.int64)
            typ = torch.zeros_like(ids)
            mask = torch.zeros_like(ids)
            for r, i in enumerate(idx):
                e = enc[i]
                ids[r, : len(e.ids)] = torch.tensor(e.ids)
                typ[r, : len(e.ids)] = torch.tensor(e.type_ids)
                mask[r, : len(e.ids)] = 1
            ids, typ, mask = ids.to(device), typ.to(device), mask.to(device)
            y = torch.tensor([pairs[i][2] for i in idx], dtype=torch.float32, device=device)
            hid = bert(input_ids=ids, attention_mask=mask, token_type_ids=typ).last_hidden_state
            m = mask.unsqueeze(-1).float()
            pooled = (hid * m).sum(1) / m.sum(1)
            logit = head(drop(pooled)).squeeze(1)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, y)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            step += 1
            total += loss.item()
            if n % 100 == 0:
                print(
                    f"  epoch {epoch} batch {n}/{len(batches)} loss {total / (n + 1):.4f} "
                    f"({time.perf_counter() - t0:.0f}s)",
                    flush=True,
                )
    weights = {
        f"encoder.{k}": v.detach().cpu().numpy().copy()
        for k, v in bert.encoder.state_dict().items()
    }
    weights["head.weight"] = head.weight.detach().cpu().numpy().copy()
    weights["head.bias"] = head.bias.detach().cpu().numpy().copy()
    return weights


def pool_scores(ce: CrossEncoder, ps: PairSet, pool: Pool, floor: float) -> np.ndarray:
    """Cross-encoder probability per (query, candidate) over `floor`; -1 below it (not run)."""
    prob = np.full(pool.cand.shape, -1.0, dtype=np.float32)
    todo = [
        (i, j)
        for i in range(len(ps))
        for j in range(pool.cand.shape[1])
        if pool.cand_cos[i, j] >= floor
    ]
    for s in range(0, len(todo), 256):
        part = todo[s : s + 256]
        got = ce.score_pairs_sync(
            [ps.b[i] for i, _ in part], [pool.entries[pool.cand[i, j]] for i, j in part]
        )
        for (i, j), v in zip(part, got, strict=True):
            prob[i, j] = v
    return prob


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=DEFAULT_ARTIFACT)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--hard-neg-k", type=int, default=HARD_NEG_K)
    ap.add_argument("--paws-weight", type=int, default=3)
    ap.add_argument(
        "--protocol",
        choices=("labelled", "strict"),
        default="labelled",
        help="QQP scoring on calib when choosing the operating point (see bench.train_verifier)",
    )
    ap.add_argument("--limit", type=int, default=0, help="train on the first N rows (smoke)")
    ap.add_argument(
        "--device",
        default="auto",
        help="torch device for training: auto (cuda when present, else cpu), cpu, cuda; the"
        " operating point is chosen on the CPU with the served ONNX model either way",
    )
    ap.add_argument("--calibrate-only", action="store_true", help="keep the trained weights")
    args = ap.parse_args()
    t0 = time.perf_counter()
    data, vecs = embedded_splits()
    meta: dict[str, object] = {}
    if not args.calibrate_only:
        rows = training_pairs(data["qqp"]["train"], *vecs[("qqp", "train")], args.hard_neg_k)
        paws = training_pairs(data["paws"]["train"], *vecs[("paws", "train")], 0)
        print(f"qqp rows {len(rows)} ({sum(r[2] for r in rows):.0f} dup); paws {len(paws)}")
        rows += paws * args.paws_weight
        if args.limit:
            rows = random.Random(args.seed).sample(rows, min(args.limit, len(rows)))
        device = pick_device(args.device)
        weights = train(rows, args.layers, args.epochs, args.lr, args.seed, device)
        meta = {
            "layers": args.layers,
            "epochs": args.epochs,
            "lr": args.lr,
            "seed": args.seed,
            "max_tokens": MAX_TOKENS,
            "hard_neg_k": args.hard_neg_k,
            "paws_weight": args.paws_weight,
            "rows": len(rows),
            "device": device,
            "trained_on": "QQP dev train part + pooled hard negatives, PAWS dev train part",
            "floor": 0.9,
            "p_min": 0.5,
        }
        save_artifact(args.out, weights, meta)
        print(f"trained in {time.perf_counter() - t0:.0f}s")
    ce = CrossEncoder.load(args.out)
    meta = dict(ce.meta)
    calib = {}
    for d in ("qqp", "paws", "stsb"):
        ps = data[d]["calib"]
        va, vb = vecs[(d, "calib")]
        pool = build_pool(ps, va, vb)
        calib[d] = (pool, restated(pool, ps.b, pool_scores(ce, ps, pool, 0.5)))
    labelled = None
    if args.protocol == "labelled":  # questions joined through train and calib labels only
        roots = label_roots(data["qqp"]["train"], data["qqp"]["calib"])
        labelled = (data["qqp"]["calib"].b, roots)
    floor, p_min, report, rank = choose_point(
        calib, p_grid=np.arange(0.30, 0.9995, 0.0025), labelled=labelled
    )
    print(f"calib: floor {floor} p_min {p_min} rank {rank}\n  {json.dumps(report)}")
    meta.update(floor=floor, p_min=round(float(p_min), 4), calib=report, protocol=args.protocol)
    update_meta(args.out, meta)
    print(
        f"wrote {args.out} ({args.out.stat().st_size // 1024} KiB) in "
        f"{time.perf_counter() - t0:.0f}s"
    )


if __name__ == "__main__":
    main()
