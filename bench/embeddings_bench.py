"""/v1/embeddings throughput and latency: local engine with batching off and on, beside
sentence-transformers `encode` in a plain aiohttp handler, at several concurrencies, in one run.

    .venv/bin/python bench/embeddings_bench.py [--seconds 5] [--concurrency 1,8,32,64]

Each server runs alone in its own process (2-core machine); the load generator is a closed loop
of N aiohttp clients sending one sentence per request (STS-B dev sentences, read at run time).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backends.local.build import DEFAULT_VALIDATION, read_sentences  # noqa: E402
from tests.support.servers import free_port, wait_port  # noqa: E402

MODEL = "all-MiniLM-L6-v2"


THREADS = {"intra_op_threads": 0}


def gateway_config(port: int, batching: dict[str, Any], precision: str = "fp32") -> dict[str, Any]:
    return {
        "listeners": [{"host": "127.0.0.1", "port": port}],
        "backends": {
            "minilm": {"kind": "onnxruntime", "model": f"builtin:{MODEL}", "batching": batching,
                       "precision": precision, "session": THREADS,
                       "artifacts_dir": os.environ.get("LATENTGATE_ARTIFACTS") or None},
        },
        "routes": [{"name": "emb", "match": {"path": "/v1/embeddings"}, "protocol": "openai",
                    "backend": "minilm"}],
    }  # fmt: skip


@contextlib.contextmanager
def server(cmd: list[str], port: int) -> Iterator[str]:
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_port("127.0.0.1", port, timeout=180)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)


def gateway(batching: dict[str, Any], precision: str = "fp32") -> Any:
    port = free_port()
    cfg = Path(tempfile.mkdtemp(prefix="lg-bench-")) / "gw.yaml"
    cfg.write_text(yaml.safe_dump(gateway_config(port, batching, precision)))
    cmd = [sys.executable, "-m", "gateway", "serve", "--config", str(cfg), "--log-level", "error"]
    return server(cmd, port)


def baseline() -> Any:
    port = free_port()
    return server([sys.executable, __file__, "--serve-baseline", str(port)], port)


def serve_baseline(port: int) -> None:
    """What a user writes without the gateway: sentence-transformers inside an aiohttp handler."""
    from aiohttp import web
    from sentence_transformers import SentenceTransformer

    from backends.local.artifacts import builtin_dir

    model = SentenceTransformer(str(builtin_dir(MODEL)), device="cpu")
    model.encode(["warm-up"])

    async def embeddings(request: web.Request) -> web.Response:
        doc = await request.json()
        texts = doc["input"] if isinstance(doc["input"], list) else [doc["input"]]
        loop = asyncio.get_running_loop()
        vecs = await loop.run_in_executor(None, model.encode, texts)
        data = [{"object": "embedding", "index": i, "embedding": v.tolist()}
                for i, v in enumerate(vecs)]  # fmt: skip
        return web.json_response({"object": "list", "data": data, "model": MODEL})

    app = web.Application()
    app.router.add_post("/v1/embeddings", embeddings)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


async def ready(url: str) -> None:
    async with aiohttp.ClientSession() as s:
        for _ in range(600):
            try:
                body = {"model": MODEL, "input": "warm"}
                async with s.post(f"{url}/v1/embeddings", json=body) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} never answered")


async def load(url: str, concurrency: int, seconds: float, texts: list[str]) -> dict[str, float]:
    lat: list[float] = []
    errors = 0
    stop = time.perf_counter() + seconds
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn) as s:

        async def worker(w: int) -> None:
            nonlocal errors
            i = w
            while time.perf_counter() < stop:
                body = {"model": MODEL, "input": texts[i % len(texts)], "encoding_format": "float"}
                i += concurrency
                t0 = time.perf_counter()
                async with s.post(f"{url}/v1/embeddings", json=body) as r:
                    await r.read()
                    if r.status != 200:
                        errors += 1
                lat.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        wall = time.perf_counter() - t0
    q = statistics.quantiles(lat, n=100) if len(lat) > 1 else [lat[0]] * 99
    return {"rps": len(lat) / wall, "p50": q[49] * 1e3, "p95": q[94] * 1e3, "p99": q[98] * 1e3,
            "n": len(lat), "errors": errors}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--concurrency", default="1,8,32,64")
    ap.add_argument("--precisions", default="fp32,fp16,int8")
    ap.add_argument(
        "--intra-op-threads",
        type=int,
        default=1,
        help="ONNX Runtime threads per run (1: the event loop keeps the other core)",
    )
    ap.add_argument("--only", help="comma-separated setups to run: st,off,on")
    ap.add_argument("--serve-baseline", type=int)
    args = ap.parse_args()
    THREADS["intra_op_threads"] = args.intra_op_threads
    if args.serve_baseline:
        serve_baseline(args.serve_baseline)
        return 0
    levels = [int(c) for c in args.concurrency.split(",")]
    texts = read_sentences(DEFAULT_VALIDATION, limit=1000)
    on = {"max_batch": 64, "max_delay_ms": 2, "target_p95_ms": 50}
    setups = [
        ("sentence-transformers + aiohttp", baseline),
        ("gateway, batching off", lambda: gateway({"enabled": False})),
        ("gateway, batching on", lambda: gateway(on)),
    ]
    if args.only:
        keep = {"st": setups[0][0], "off": setups[1][0], "on": setups[2][0]}
        setups = [s for s in setups if s[0] in {keep[k] for k in args.only.split(",")}]
    results: dict[str, dict[int, dict[str, float]]] = {}
    for name, start in setups:
        with start() as url:
            asyncio.run(ready(url))
            results[name] = {}
            for c in levels:
                asyncio.run(load(url, c, 1.0, texts))  # settle
                results[name][c] = r = asyncio.run(load(url, c, args.seconds, texts))
                print(f"{name:<34} c={c:<3} {r['rps']:8.1f} req/s  p50 {r['p50']:7.1f} ms  "
                      f"p95 {r['p95']:7.1f} ms  p99 {r['p99']:7.1f} ms  errors {r['errors']:.0f}",
                      flush=True)  # fmt: skip
    print("\nconcurrency  " + "  ".join(f"{n:>34}" for n in results))
    for c in levels:
        cells = [f"{r[c]['rps']:7.1f} r/s p50 {r[c]['p50']:6.1f} p99 {r[c]['p99']:6.1f}"
                 for r in results.values()]  # fmt: skip
        print(f"{c:>11}  " + "  ".join(f"{x:>34}" for x in cells))
    off, on_r = results.get("gateway, batching off", {}), results.get("gateway, batching on", {})
    st = results.get("sentence-transformers + aiohttp", {})
    if 1 in off and 32 in on_r and 32 in st:
        print(
            f"\nbatched c=32 / batch-1 c=1: {on_r[32]['rps'] / off[1]['rps']:.2f}x; "
            f"batched c=32 / unbatched c=32: {on_r[32]['rps'] / off[32]['rps']:.2f}x; "
            f"batched c=32 / sentence-transformers c=32: "
            f"{on_r[32]['rps'] / st[32]['rps']:.2f}x"
        )
    if args.precisions:
        precision_table(args.precisions.split(","), args.seconds, texts, on)
    return 0


def precision_table(
    precisions: list[str], seconds: float, texts: list[str], on: dict[str, Any]
) -> None:
    """Batched c=32 per promoted precision, beside the accuracy `latentgate build` measured."""
    from backends.local.artifacts import resolve

    art = resolve(f"builtin:{MODEL}", os.environ.get("LATENTGATE_ARTIFACTS") or None)
    print("\nprecision  batched c=32 req/s  speed-up  mean cos to fp32  (from latentgate build)")
    base = None
    for p in precisions:
        report = art.onnx_path.parent / f"report.{p}.json"
        acc = json.loads(report.read_text())["mean_cosine"] if report.exists() else None
        if p != "fp32" and not (art.onnx_path.parent / f"model.{p}.onnx").exists():
            note = f"mean cos {acc:.5f}: refused by the build" if acc else "not built"
            print(f"{p:<9}  {'-':>19}  {'-':>8}  {note}")
            continue
        with gateway(on, p) as url:
            asyncio.run(ready(url))
            asyncio.run(load(url, 32, 1.0, texts))
            rps = asyncio.run(load(url, 32, seconds, texts))["rps"]
        base = base or rps
        print(f"{p:<9}  {rps:19.1f}  {rps / base:7.2f}x  {acc if acc is not None else 1.0:.5f}")


if __name__ == "__main__":
    sys.exit(main())
