"""/admin/cache/stats with `--workers N`: the gateway's figures, not one worker's.

Workers share the port, so the call lands on one of them, and it used to answer with its own
counters and memory tier only: 1/N of the lookups and hits, a hit ratio that moved from call to
call, memory entries that were another worker's misses. The worker a call lands on now asks its
siblings on their private unix sockets (gateway.worker_metrics) and answers with the sums, each
worker's own figures under `workers`, and how many did not answer (`workers_missing`: starting,
or gone). Redis is one store for all: its entries and bytes are said once, its hits summed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from gateway.worker_metrics import Workers

log = logging.getLogger("latentgate.worker_stats")

PATH = "/cache-stats"
TIMEOUT_S = 2.0
_COUNTS = ("lookups", "hits", "misses", "bypasses", "in_flight")
# a worker's own in the sum, not one worker's as everyone's (its writes_error: under "workers")
PER_WORKER = ("hits", "hit_ratio", "breaker", "writes", "writes_error")

Stats = dict[str, Any]


def handler(stats: Callable[[], Awaitable[Stats | None]]) -> Callable[..., Awaitable[web.Response]]:
    """A sibling's side: this worker's own figures (None: no cache configured)."""

    async def own(request: web.Request) -> web.Response:
        return web.json_response(await stats())

    return own


async def gather(workers: Workers, own: Stats) -> Stats:
    others = [i for i in range(workers.count) if i != workers.index]
    answers = await asyncio.gather(*(_ask(workers, i) for i in others))
    each = {workers.index: own} | {
        i: a for i, a in zip(others, answers, strict=True) if isinstance(a, dict)
    }
    return merge(each, workers.count)


def merge(each: dict[int, Stats], count: int) -> Stats:
    """The sums over `each` (worker index: its stats), with every worker's own figures."""
    out: Stats = {k: sum(int(s.get(k, 0)) for s in each.values()) for k in _COUNTS}
    lookups = out["lookups"]
    out["hit_ratio"] = out["hits"] / lookups if lookups else 0.0
    tiers: Stats = {}
    memory = [s["tiers"]["memory"] for s in each.values() if "memory" in s.get("tiers", {})]
    if memory:
        hits = sum(int(m.get("hits", 0)) for m in memory)
        tiers["memory"] = {
            **{k: sum(int(m.get(k, 0)) for m in memory) for k in ("entries", "bytes", "max_bytes")},
            "hits": hits,
            "hit_ratio": hits / lookups if lookups else 0.0,
        }
        redis = [s["tiers"]["redis"] for s in each.values() if "redis" in s.get("tiers", {})]
        if redis:
            # one store: its size as any worker saw it (the first that could read it)
            seen = next((r for r in redis if "error" not in r), redis[0])
            r_hits = sum(int(r.get("hits", 0)) for r in redis)
            past_l1 = lookups - hits
            tiers["redis"] = {
                **{k: v for k, v in seen.items() if k not in PER_WORKER},
                "hits": r_hits,
                "hit_ratio": r_hits / past_l1 if past_l1 else 0.0,
                # each worker's breakers (its write breaker too: cache.tiers.redis_writes)
                **{
                    k: {str(i): s["tiers"]["redis"].get(k) for i, s in each.items()}
                    for k in ("breaker", "writes")
                },
            }
    out["tiers"] = tiers
    out["workers"] = {str(i): s for i, s in sorted(each.items())}
    out["workers_missing"] = count - len(each)
    return out


async def _ask(workers: Workers, index: int) -> Stats | None:
    connector = aiohttp.UnixConnector(path=workers.socket(index))
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    try:
        async with (
            aiohttp.ClientSession(connector=connector, timeout=timeout) as s,
            s.post("http://worker" + PATH) as r,
        ):
            if r.status != 200:
                return None
            doc = json.loads(await r.read())
            return doc if isinstance(doc, dict) else None
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
        log.debug("worker %d did not answer for cache stats: %r", index, exc)
        return None
