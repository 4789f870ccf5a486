"""Three gateways on one Redis: standalone next to a 3+3 Redis Cluster (issue 18 item 4).

    python -m bench.redis_modes [--seconds 10] [--clients 16]

Per mode, side by side in one run:
- three gateway processes (exact cache, memory + Redis) fed one shared stream: 16 clients, each
  request to gateway i % 3, prompts drawn from a skewed pool of 3,000, so most prompts are seen
  first at one gateway and again at another. Throughput, latency p50/p95/p99, hit rate, and the
  shared hit rate: of the requests for a prompt this gateway had not seen but another had, the
  share served from Redis.
- semantic sync lag: two RedisSync replicators on the same Redis (in this process, as in two
  gateways), 300 adds at ~50/s from one; the time from the add to the other's apply, p50/p99.
The failover cost (errors, time until shared hits resume) is measured by
tests/fault/test_redis_modes.py, which prints it.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from typing import Any

import aiohttp
import numpy as np
from prometheus_client import CollectorRegistry

from cache.semantic.index import VectorIndex
from cache.semantic.metrics import SemanticMetrics
from cache.semantic.records import Entry
from cache.semantic.stage import SemanticStage
from cache.semantic.sync import RedisSync
from cache.settings import RedisSettings
from tests.integration.cache.conftest import cache_config
from tests.support.redis_topologies import RedisClusterServers
from tests.support.servers import GatewayProcess, RedisServer, ServerThread
from tests.support.upstream import build_upstream

POOL = 3000


class _NoEmbedder:
    dim, device, backend, space = 384, "none", "none", "none"


async def stream(urls: list[str], seconds: float, clients: int) -> dict[str, Any]:
    rng = random.Random(7)
    weights = [1 / (i + 1) ** 0.8 for i in range(POOL)]
    seen: dict[int, set[int]] = {}
    lat: list[float] = []
    hits = shared_asks = shared_hits = errors = 0
    stop = time.monotonic() + seconds
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as s:

        async def client(c: int) -> None:
            nonlocal hits, shared_asks, shared_hits, errors
            i = c
            while time.monotonic() < stop:
                p = rng.choices(range(POOL), weights)[0]
                g = i % len(urls)
                gws = seen.setdefault(p, set())
                shared = g not in gws and bool(gws)
                gws.add(g)
                body = {
                    "model": "m",
                    "temperature": 0,
                    "messages": [{"role": "user", "content": f"prompt {p}"}],
                }
                t = time.perf_counter()
                try:
                    async with s.post(urls[g] + "/v1/chat/completions", json=body) as r:
                        await r.read()
                        hit = r.headers.get("X-Cache") == "hit"
                        ok = r.status == 200
                except (aiohttp.ClientError, TimeoutError):
                    ok, hit = False, False
                lat.append(time.perf_counter() - t)
                errors += not ok
                hits += hit
                if shared:
                    shared_asks += 1
                    shared_hits += hit
                i += clients

        await asyncio.gather(*(client(c) for c in range(clients)))
    ms = np.asarray(lat) * 1e3
    return {
        "requests": len(lat),
        "rps": len(lat) / seconds,
        "p": [float(np.percentile(ms, q)) for q in (50, 95, 99)],
        "hit_rate": hits / max(1, len(lat)),
        "shared_hit_rate": shared_hits / max(1, shared_asks),
        "errors": errors,
    }


async def sync_lag(settings: RedisSettings, n: int = 300) -> list[float]:
    def stage() -> SemanticStage:
        return SemanticStage(
            _NoEmbedder(),  # type: ignore[arg-type]
            VectorIndex(384, device="cpu"),
            SemanticMetrics(CollectorRegistry()),
        )

    a, b = stage(), stage()
    sent: dict[str, float] = {}
    lags: list[float] = []
    inner = b.apply_add

    def timed(entry: Entry) -> None:
        inner(entry)
        if entry.exact_key in sent:
            lags.append(time.perf_counter() - sent[entry.exact_key])

    b.apply_add = timed  # type: ignore[method-assign]
    sa, sb = RedisSync.from_settings(a, settings), RedisSync.from_settings(b, settings)
    await sa.start()
    await sb.start()
    rng = np.random.default_rng(1)
    try:
        for i in range(n):
            v = rng.normal(size=384).astype(np.float32)
            key = f"lag-{i}"
            sent[key] = time.perf_counter()
            await a.add("ns", f"question {i}", key, ttl=60, vector=v / np.linalg.norm(v))
            await asyncio.sleep(0.02)
        await asyncio.sleep(1.0)
    finally:
        await sa.aclose()
        await sb.aclose()
    return lags


def run_mode(mode: str, upstream: ServerThread, seconds: float, clients: int) -> dict[str, Any]:
    topo: Any = RedisServer() if mode == "standalone" else RedisClusterServers()
    topo.start()
    gws: list[GatewayProcess] = []
    try:
        cfg = cache_config(upstream.url, topo.url, routes=("chat",))
        cfg["cache"]["redis"]["mode"] = mode
        gws = [GatewayProcess(cfg).start() for _ in range(3)]
        out = asyncio.run(stream([g.url for g in gws], seconds, clients))
        settings = RedisSettings(url=topo.url, mode=mode, key_prefix="lag:")
        lags = np.asarray(asyncio.run(sync_lag(settings))) * 1e3
        out["lag"] = [float(np.percentile(lags, q)) for q in (50, 99)] if len(lags) else []
        out["lag_n"] = len(lags)
        return out
    finally:
        for g in gws:
            g.stop()
        topo.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=16)
    args = ap.parse_args()
    upstream = ServerThread(build_upstream).start()
    try:
        print(
            "mode        requests   req/s   p50/p95/p99 ms        hit rate  shared hits  errors"
            "  sync lag p50/p99 ms (n)"
        )
        for mode in ("standalone", "cluster"):
            r = run_mode(mode, upstream, args.seconds, args.clients)
            p, lag = r["p"], r["lag"]
            print(
                f"{mode:<11} {r['requests']:>8} {r['rps']:>7.0f}   "
                f"{p[0]:.1f}/{p[1]:.1f}/{p[2]:.1f}".ljust(22)
                + f"  {r['hit_rate']:>7.3f}  {r['shared_hit_rate']:>11.3f}  {r['errors']:>6}"
                f"  {lag[0]:.1f}/{lag[1]:.1f} ({r['lag_n']})",
                flush=True,
            )
    finally:
        upstream.stop()


if __name__ == "__main__":
    main()
