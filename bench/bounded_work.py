"""Bounded work per request: /healthz latency while oversized requests are in flight, and RSS.

One command: .venv/bin/python bench/bounded_work.py [--rounds 1]
The default config (config/latentgate.yaml) served by `latentgate serve`, its upstream a test
upstream process on loopback. For each oversized request (10 MB /v1/embeddings input to the
local model, 15 MB chat at temperature 0, 10,000-text v2 infer on the local model) it polls
/healthz every 5 ms while the request is in flight and prints the request's status and time,
/healthz p50/p95/p99/max, and the gateway's RSS before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.servers import free_port, wait_port  # noqa: E402


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))] if s else float("nan")


def cases() -> list[tuple[str, str, bytes, dict[str, str]]]:
    ten_mb = "lorem ipsum dolor sit amet " * (10_000_000 // 27)
    fifteen_mb = "please summarise this paragraph " * (15_000_000 // 32)
    texts = [f"short text number {i} about the weather" for i in range(10_000)]
    v2 = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]}
    chat = {
        "model": "m",
        "temperature": 0,
        "messages": [{"role": "user", "content": fifteen_mb}],
    }
    emb = {"model": "all-MiniLM-L6-v2", "input": ten_mb}
    ctype = {"Content-Type": "application/json"}
    return [
        ("embeddings 10 MB input", "/v1/embeddings", json.dumps(emb).encode(), ctype),
        ("chat 15 MB, temperature 0", "/v1/chat/completions", json.dumps(chat).encode(), ctype),
        (
            "v2 infer, 10,000 texts",
            "/v2/models/all-MiniLM-L6-v2/infer",
            json.dumps(v2).encode(),
            ctype,
        ),
    ]


async def one_case(
    url: str, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, float, list[float], str]:
    lat: list[float] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as s:

        async def big() -> tuple[int, float, str]:
            t0 = time.perf_counter()
            async with s.post(url + path, data=body, headers=headers) as r:
                text = (await r.read())[:160].decode(errors="replace")
                return r.status, time.perf_counter() - t0, text

        task = asyncio.create_task(big())
        while not task.done():
            t0 = time.perf_counter()
            async with s.get(url + "/healthz") as r:
                await r.read()
            lat.append((time.perf_counter() - t0) * 1000)
            await asyncio.sleep(0.005)
        status, took, text = await task
    return status, took, lat, text


async def warm(url: str) -> None:
    async with aiohttp.ClientSession() as s:
        for path, doc in [
            ("/v1/embeddings", {"model": "all-MiniLM-L6-v2", "input": ["warm up", "again"]}),
            (
                "/v1/chat/completions",
                {"model": "m", "temperature": 0, "messages": [{"role": "user", "content": "hi"}]},
            ),
            (
                "/v2/models/all-MiniLM-L6-v2/infer",
                {
                    "inputs": [
                        {"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]}
                    ]
                },
            ),
        ]:
            async with s.post(url + path, json=doc) as r:
                await r.read()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    up_port, gw_port, admin_port = free_port(), free_port(), free_port()
    py = sys.executable
    up = subprocess.Popen(
        [py, "-m", "tests.support.upstream", "--port", str(up_port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    env = {
        **os.environ,
        "LATENTGATE_UPSTREAM": f"http://127.0.0.1:{up_port}",
        "LATENTGATE_PORT": str(gw_port),
        "LATENTGATE_ADMIN_PORT": str(admin_port),
        "PYTHONPATH": str(ROOT),
    }
    gw = subprocess.Popen(
        [py, "-m", "gateway", "serve", "--config", "config/latentgate.yaml"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{gw_port}"
    try:
        wait_port("127.0.0.1", up_port, 30)
        wait_port("127.0.0.1", gw_port, 120)
        asyncio.run(warm(url))
        base = rss_mb(gw.pid)
        print(f"gateway RSS after warm-up: {base:.0f} MB")
        print(
            f"{'request':28} {'status':>6} {'took s':>7} {'healthz n':>9} {'p50 ms':>7} "
            f"{'p95 ms':>7} {'p99 ms':>7} {'max ms':>7} {'RSS MB':>7}"
        )
        for _ in range(args.rounds):
            for name, path, body, headers in cases():
                status, took, lat, text = asyncio.run(one_case(url, path, body, headers))
                del body
                time.sleep(0.5)
                print(
                    f"{name:28} {status:>6} {took:>7.2f} {len(lat):>9} {pct(lat, 50):>7.1f} "
                    f"{pct(lat, 95):>7.1f} {pct(lat, 99):>7.1f} {max(lat, default=0):>7.1f} "
                    f"{rss_mb(gw.pid):>7.0f}"
                )
                if status >= 500:
                    print(f"   answer: {text}")
        after = rss_mb(gw.pid)
        print(f"RSS before {base:.0f} MB, after {after:.0f} MB: {after - base:+.0f} MB")
    finally:
        for p in (gw, up):
            p.terminate()
            p.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
