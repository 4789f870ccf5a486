"""gRPC ModelInfer side by side, in one run: `.venv/bin/python -m bench.grpc_bench`.

Targets, all answering the same ModelInfer (model `m`, FP32 [1, 16] + BYTES [1], raw contents,
an `authorization` metadata entry so the tenant is part of the key):
  direct        the gRPC v2 test upstream (tests/support/grpc_upstream.py), no gateway
  gw-pass       latentgate's gRPC listener → a gRPC pool of that upstream, cache off
  gw-hit        the same with the exact cache on (memory): every measured call is an L1 hit
The load comes from a separate process (grpc.aio, raw bytes, N concurrent callers on one
channel), so client and server do not share an event loop. Each target runs `--seconds` at
1 and at `--concurrency` callers after a 1 s warm-up; p50/p95/p99 per call and calls/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.servers import GatewayProcess, free_port, wait_port  # noqa: E402

METHOD = "/inference.GRPCInferenceService/ModelInfer"
METADATA = (("authorization", "Bearer sk-bench"),)


def request_bytes() -> bytes:
    import numpy as np
    from tritonclient.grpc import service_pb2 as pb2

    req = pb2.ModelInferRequest(model_name="m", id="bench")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    req.inputs.add(name="INPUT1", datatype="BYTES", shape=[1])
    req.raw_input_contents.append(np.arange(16, dtype="<f4").tobytes())
    req.raw_input_contents.append(b"\x05\x00\x00\x00hello")
    return bytes(req.SerializeToString())


async def _load(target: str, concurrency: int, seconds: float, warmup: float) -> dict[str, Any]:
    import grpc.aio

    body = request_bytes()
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.unary_unary(METHOD)
        await call(body, metadata=METADATA, timeout=10)  # connected, and cached where it caches
        latencies: list[float] = []
        errors = 0
        measuring = False
        stop_at = time.perf_counter() + warmup + seconds

        async def caller() -> None:
            nonlocal errors
            while (now := time.perf_counter()) < stop_at:
                try:
                    await call(body, metadata=METADATA, timeout=10)
                except grpc.aio.AioRpcError:
                    errors += 1
                if measuring:
                    latencies.append(time.perf_counter() - now)

        tasks = [asyncio.create_task(caller()) for _ in range(concurrency)]
        await asyncio.sleep(warmup)
        measuring, started = True, time.perf_counter()
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - started
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000

    return {
        "calls_per_s": len(latencies) / elapsed,
        "p50_ms": pct(0.50),
        "p95_ms": pct(0.95),
        "p99_ms": pct(0.99),
        "errors": errors,
        "calls": len(latencies),
    }


def measure(target: str, concurrency: int, seconds: float) -> dict[str, Any]:
    """One load run in its own process; returns its JSON line."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.grpc_bench", "--client", target,
         "--concurrency", str(concurrency), "--seconds", str(seconds)],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    return dict(json.loads(out.strip().splitlines()[-1]))


def gateway_config(upstream_port: int, grpc_port: int, cached: bool) -> dict[str, Any]:
    exact = {"enabled": True, "tiers": ["memory"]} if cached else {"enabled": False}
    return {
        "listeners": [{"name": "grpc", "protocol": "grpc", "host": "127.0.0.1", "port": grpc_port}],
        "backends": {
            "grpc-up": {"kind": "remote", "replicas": [f"grpc://127.0.0.1:{upstream_port}"]}
        },
        "routes": [
            {
                "name": "grpc-v2",
                "match": {"prefix": "/inference.GRPCInferenceService/"},
                "protocol": "grpc",
                "backend": "grpc-up",
                "cache": {"exact": exact},
            }
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--client", help=argparse.SUPPRESS)  # the load process
    args = parser.parse_args()
    if args.client:
        result = asyncio.run(_load(args.client, args.concurrency, args.seconds, 1.0))
        print(json.dumps(result))
        return
    up_port = free_port()
    upstream = subprocess.Popen(
        [sys.executable, "-m", "tests.support.grpc_upstream", "--port", str(up_port)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    rows: list[tuple[str, int, dict[str, Any]]] = []
    try:
        wait_port("127.0.0.1", up_port)
        for c in (1, args.concurrency):
            rows.append(("direct", c, measure(f"127.0.0.1:{up_port}", c, args.seconds)))
        for name, cached in (("gw-pass", False), ("gw-hit", True)):
            port = free_port()
            gw = GatewayProcess(gateway_config(up_port, port, cached)).start()
            try:
                wait_port("127.0.0.1", port)
                for c in (1, args.concurrency):
                    rows.append((name, c, measure(f"127.0.0.1:{port}", c, args.seconds)))
            finally:
                gw.stop()
    finally:
        upstream.kill()
        upstream.wait(10)
    print(f"\n{'target':<10} {'conc':>4} {'calls/s':>9} {'p50 ms':>8} {'p95 ms':>8} "
          f"{'p99 ms':>8} {'errors':>6}")  # fmt: skip
    for name, c, r in rows:
        print(
            f"{name:<10} {c:>4} {r['calls_per_s']:>9,.0f} {r['p50_ms']:>8.2f} "
            f"{r['p95_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['errors']:>6}"
        )


if __name__ == "__main__":
    main()
