"""The speed parts of `python -m bench.semantic_eval`: one lookup's embed / search / verify, and
index search at 100k entries (flat against HNSW, with recall@1 against exact search)."""

from __future__ import annotations

import sys
import time

import numpy as np

from bench.gptcache_run import pct
from bench.semantic_data import MODEL_TAG, PairSet, embed_cached, unseen_spans
from cache.semantic.features import text_info
from cache.semantic.index import VectorIndex
from cache.semantic.verifier import Verifier


def latency(
    data: dict[str, dict[str, PairSet]],
    enc_one,  # type: ignore[no-untyped-def]
    ver: Verifier,
    enc,
    n: int,
) -> dict[str, object]:
    ps = data["qqp"]["eval"]
    va = embed_cached(ps.a, enc, MODEL_TAG)
    index = VectorIndex(va.shape[1], device="cpu")
    infos = {}
    spans = unseen_spans()  # as the serving stage builds them (Embedder.unseen)
    for i, (t, v) in enumerate(zip(ps.a, va, strict=True)):
        index.add("ns", i, v)
        infos[i] = text_info(t, spans)
    emb, srch, verf, total = [], [], [], []
    for q in ps.b[:n]:
        t0 = time.perf_counter()
        qv = enc_one(q)
        t1 = time.perf_counter()
        hits = index.search("ns", qv, 5)
        t2 = time.perf_counter()
        qi = text_info(q, spans)
        ids = [h[0] for h in hits]
        ver.choose(qi, qv, [infos[i] for i in ids], va[ids], np.asarray([h[1] for h in hits]))
        t3 = time.perf_counter()
        emb.append((t1 - t0) * 1000)
        srch.append((t2 - t1) * 1000)
        verf.append((t3 - t2) * 1000)
        total.append((t3 - t0) * 1000)
    out = {
        name: {"p50": pct(v, 50), "p95": pct(v, 95), "p99": pct(v, 99)}
        for name, v in (("embed", emb), ("search", srch), ("verify", verf), ("total", total))
    }
    print(f"\nlookup latency, one query at a time, {len(ps.a)} entries, {n} queries (ms):")
    for name, v in out.items():
        print(f"  {name:<7} p50 {v['p50']:.3f}  p95 {v['p95']:.3f}  p99 {v['p99']:.3f}")
    return out


def search_100k(data: dict[str, dict[str, PairSet]], enc, n: int = 200) -> dict[str, object]:  # type: ignore[no-untyped-def]
    vecs = np.concatenate(
        [
            embed_cached(ps.a + ps.b, enc, MODEL_TAG)
            for parts in data.values()
            for ps in parts.values()
        ]
    )
    vecs = np.unique(vecs, axis=0)
    rng = np.random.default_rng(0)
    while len(vecs) < 100_000:  # top up with perturbed real vectors (clustered, like real text)
        extra = vecs[rng.integers(0, len(vecs), 100_000 - len(vecs))]
        extra = extra + rng.normal(0, 0.02, extra.shape).astype(np.float32)
        vecs = np.concatenate([vecs, extra / np.linalg.norm(extra, axis=1, keepdims=True)])
    vecs = vecs[:100_000].astype(np.float32)
    queries = vecs[rng.integers(0, len(vecs), n)] + rng.normal(0, 0.05, (n, vecs.shape[1])).astype(
        np.float32
    )
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    out: dict[str, object] = {}
    exact = vecs @ queries.T
    truth = exact.argmax(axis=0)
    for kind, flat_max in (("flat", 200_000), ("hnsw", 1000)):
        idx = VectorIndex(vecs.shape[1], flat_max=flat_max, device="cpu")
        t = time.perf_counter()
        for i, v in enumerate(vecs):
            idx.add("ns", i, v)
        build = time.perf_counter() - t
        lat, agree = [], 0
        for j, q in enumerate(queries):
            t = time.perf_counter()
            r = idx.search("ns", q, 5)
            lat.append((time.perf_counter() - t) * 1000)
            agree += int(bool(r) and r[0][0] == truth[j])
        out[kind] = {
            "p50_ms": pct(lat, 50),
            "p95_ms": pct(lat, 95),
            "p99_ms": pct(lat, 99),
            "recall@1": agree / n,
            "build_s": build,
        }
        print(
            f"  index {kind:<5} 100k: search p50 {pct(lat, 50):.3f} ms p95 {pct(lat, 95):.3f} "
            f"p99 {pct(lat, 99):.3f}, recall@1 {agree / n:.3f}, build {build:.1f} s"
        )
    return out


def one_query_encoder(enc):  # type: ignore[no-untyped-def]
    """The serving embedder when issue 5's ONNX engine is present, else sentence-transformers."""
    try:
        from backends.local.text_encoder import load_text_encoder

        te = load_text_encoder()
        print(f"embed: ONNX Runtime text encoder on {te.device}")
        return lambda t: te.encode([t])[0]
    except ImportError:
        print(
            "embed: sentence-transformers (the ONNX text encoder is not on this branch yet)",
            file=sys.stderr,
        )
        return lambda t: enc([t])[0]
