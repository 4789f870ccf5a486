"""Semantic index memory, accuracy and speed per vector storage (issue 18 item 3).

    python -m bench.semantic_memory            # everything below, side by side
    python -m bench.semantic_memory --quick    # 100k only (no 1M runs)

- RSS per entry: a fresh child process per (entries, quantizer) adds N entries through
  SemanticStage.apply_add (real exact keys and namespaces, ~60-character texts, synthetic
  clustered unit vectors) and reports (RSS after - RSS before) / N, next to the stage's own
  estimate (`nbytes`, what cache.semantic.max_bytes bounds) and FAISS's bytes.
- Search latency: 2,000 queries (stored vectors plus noise) against that index, p50/p95/p99.
- Top-1 agreement with exact search: the development pair sets (bench.semantic_data splits,
  every first text indexed, every second text a query) in one namespace, against numpy's exact
  argmax over the fp32 vectors; for the default flat shards and forced HNSW (flat_max=5000).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import subprocess
import sys
import time
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from cache.keys import KeyBuilder
from cache.semantic.index import Quantizer, VectorIndex
from cache.semantic.metrics import SemanticMetrics
from cache.semantic.namespace import namespace_of
from cache.semantic.records import Entry
from cache.semantic.stage import SemanticStage

DIM = 384
WORDS = [
    "reset",
    "change",
    "find",
    "cancel",
    "update",
    "close",
    "open",
    "transfer",
    "order",
    "track",
    "refund",
    "block",
]
THINGS = [
    "password",
    "card",
    "account",
    "order",
    "parcel",
    "payment",
    "address",
    "pin",
    "subscription",
    "phone",
]


class _NoEmbedder:
    dim, device, backend, space = DIM, "none", "none", "none"


def rss_bytes() -> int:
    """RSS after a full collection and glibc's malloc_trim: the live heap, not the high-water
    mark that this script's own temporary arrays leave behind."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def synthetic(rng: np.random.Generator, centers: np.ndarray, n: int) -> np.ndarray:
    """Unit vectors around topic centres: neighbours exist, as with real queries."""
    v = centers[rng.integers(0, len(centers), n)]
    v += rng.normal(scale=0.04, size=(n, DIM)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v


def measure_rss(n: int, quantizer: str, queries: int = 2000) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(5000, DIM)).astype(np.float32)
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    index = VectorIndex(DIM, device="cpu", quantizer=quantizer)  # type: ignore[arg-type]
    stage = SemanticStage(
        _NoEmbedder(),  # type: ignore[arg-type]
        index,
        SemanticMetrics(CollectorRegistry()),
        max_entries=n + 1,
        max_bytes=1 << 40,
    )
    keys = KeyBuilder("chat", ["Authorization"])
    ns = namespace_of("chat", "gpt-4o-mini", {"system": "You are helpful."}, "tenant-1")
    sample_q: list[np.ndarray] = []
    before = rss_bytes()
    t0 = time.perf_counter()
    chunk = 1_000
    for start in range(0, n, chunk):
        vecs = synthetic(rng, centers, min(chunk, n - start))
        for j, vec in enumerate(vecs):
            i = start + j
            text = f"how can i {WORDS[i % 12]} the {THINGS[i % 10]} on my account, case {i:07d}?"
            key = keys.build("gpt-4o-mini", {"messages": text}, {"Authorization": "k"}).value
            stage.apply_add(Entry(ns, key, text, vec, time.time() + 3600))
        if start // chunk % max(1, n // chunk // 20) == 0 and len(sample_q) < queries:
            sample_q.extend(vecs[: queries // 20].copy())
        del vecs
    build_s = time.perf_counter() - t0
    after = rss_bytes()
    q = np.stack(sample_q[:queries])
    q = q + rng.normal(scale=0.02, size=q.shape).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    lat, cpu = [], []
    for row in q:
        t, c = time.perf_counter(), time.thread_time()
        index.search(ns, row, 5)
        cpu.append(time.thread_time() - c)
        lat.append(time.perf_counter() - t)
    ms = np.asarray(lat) * 1e3
    cpu_ms = np.asarray(cpu) * 1e3
    return {
        "n": n,
        "quantizer": quantizer,
        "kind": index.kinds(),
        "rss_per_entry": (after - before) / n,
        "estimate_per_entry": stage.nbytes / n,
        "faiss_per_entry": index.nbytes() / n,
        "build_s": build_s,
        "search_ms": {p: float(np.percentile(ms, p)) for p in (50, 95, 99)},
        # CPU time of the searching thread: what the search costs on a core of its own (the
        # shared machine's wall clock includes time spent descheduled)
        "search_cpu_ms": {p: float(np.percentile(cpu_ms, p)) for p in (50, 95, 99)},
        "searches_per_s": len(ms) / (ms.sum() / 1e3),
    }


def agreement() -> list[dict[str, Any]]:
    from bench.semantic_data import embedded_splits

    _, vecs = embedded_splits()
    a = np.concatenate([v[0] for v in vecs.values()]).astype(np.float32)
    b = np.concatenate([v[1] for v in vecs.values()]).astype(np.float32)
    # one entry per distinct first text; queries are every second text
    _, first = np.unique(a.round(5), axis=0, return_index=True)
    a = a[np.sort(first)]
    exact = np.argmax(b @ a.T, axis=1)
    out = []
    quantizers: tuple[Quantizer, ...] = ("fp32", "fp16", "8bit")
    for quantizer in quantizers:
        # 20,000 (the default): these sets stay exhaustive. 5,000: HNSW, its 8-bit ranges
        # trained on the first 5,001 vectors (the default trains on 20,001), the rest added after
        for flat_max in (20_000, 5_000):
            index = VectorIndex(DIM, device="cpu", quantizer=quantizer, flat_max=flat_max)
            for i, v in enumerate(a):
                index.add("ns", i, v)
            got = np.asarray([index.search("ns", q, 1)[0][0] for q in b])
            out.append(
                {
                    "quantizer": quantizer,
                    "shard": next(iter(index.kinds())),
                    "entries": len(a),
                    "queries": len(b),
                    "top1_agreement": float((got == exact).mean()),
                }
            )
    return out


def _child(n: int, quantizer: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.semantic_memory", "--child", str(n), quantizer]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="100k entries only")
    ap.add_argument("--child", nargs=2, metavar=("N", "QUANTIZER"), help=argparse.SUPPRESS)
    ap.add_argument("--only", choices=["memory", "agreement"], help="one half of the run")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure_rss(int(args.child[0]), args.child[1])))
        return
    runs = [(100_000, "fp32"), (100_000, "fp16"), (100_000, "8bit")]
    if not args.quick:
        runs.append((1_000_000, "8bit"))
    if args.only == "agreement":
        runs = []
    print(
        "entries  vectors  shard  RSS/entry  estimate  faiss  "
        "search wall p50/p95/p99 ms (rate)  search CPU p50/p95/p99 ms  build s"
    )
    for n, qz in runs:
        r = _child(n, qz)
        s, c = r["search_ms"], r["search_cpu_ms"]
        print(
            f"{n:>8} {qz:>7}  {','.join(r['kind'])}  {r['rss_per_entry']:>8.0f}  "
            f"{r['estimate_per_entry']:>8.0f} {r['faiss_per_entry']:>6.0f}  "
            f"{s['50']:.3f}/{s['95']:.3f}/{s['99']:.3f} ({r['searches_per_s']:.0f}/s)  "
            f"{c['50']:.3f}/{c['95']:.3f}/{c['99']:.3f}  {r['build_s']:.0f}",
            flush=True,
        )
    if args.only != "memory":
        print("\nvectors  shard  entries  queries  top-1 agreement with exact search")
        for row in agreement():
            print(
                f"{row['quantizer']:>7}  {row['shard']:>5}  {row['entries']:>7}  "
                f"{row['queries']:>7}  {row['top1_agreement']:.4f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
