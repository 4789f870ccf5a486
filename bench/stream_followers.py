"""Identical streaming requests arriving while the first is still streaming, side by side in one
run: `python -m bench.stream_followers [--rounds 20]`.

Each round sends one streamed chat request (the leader: ~16 SSE events, 0.1 s apart, after
0.3 s to the first), and, once its first event is in, K identical streamed requests (the
followers). Targets:
  direct       the test upstream (tests/support/upstream.py): every request is its own call
  no-coalesce  latentgate, exact cache on, `coalesce: false`: each follower calls upstream
  followed     latentgate, exact cache on (default): followers join the leader's stream live
Reported per target: the followers' time to first byte and to last byte (p50/p95/p99 ms over
all rounds), and the upstream calls per round. Before followers were sent the stream live,
a follower's first byte came only after the leader's last.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.cache.conftest import cache_config  # noqa: E402
from tests.support.servers import ServerThread  # noqa: E402
from tests.support.upstream import build_upstream  # noqa: E402

HEADERS = {"X-Test-Delay": "0.3", "X-Test-Event-Delay": "0.1"}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


async def one(s: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[float, float]:
    """(first byte, last byte) seconds after sending."""
    t = time.monotonic()
    first = 0.0
    async with s.post(url + "/v1/chat/completions", json=body, headers=HEADERS) as r:
        async for _ in r.content.iter_any():
            first = first or time.monotonic() - t
    return first, time.monotonic() - t


async def calls(upstream_url: str) -> int:
    async with aiohttp.ClientSession() as s, s.get(upstream_url + "/_test/stats") as r:
        return int((await r.json())["requests"].get("/v1/chat/completions", 0))


async def run(url: str, upstream_url: str, rounds: int, k: int, tag: str) -> dict[str, Any]:
    ttfb: list[float] = []
    ttlb: list[float] = []
    before = await calls(upstream_url)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as s:
        for i in range(rounds):
            words = " ".join(f"w{j}" for j in range(10))
            body = {
                "model": "m",
                "temperature": 0,
                "stream": True,
                "messages": [{"role": "user", "content": f"{tag} round {i}: {words}"}],
            }
            leader = asyncio.create_task(one(s, url, body))
            await asyncio.sleep(0.45)  # past the leader's first event
            got = await asyncio.gather(*(one(s, url, body) for _ in range(k)))
            await leader
            ttfb += [f for f, _ in got]
            ttlb += [last for _, last in got]
    return {
        "ttfb": ttfb,
        "ttlb": ttlb,
        "calls": (await calls(upstream_url) - before) / rounds,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--followers", type=int, default=4)
    args = ap.parse_args()
    from gateway.app import build_app
    from gateway.config import Settings

    with ExitStack() as stack:
        up = ServerThread(build_upstream).start()
        stack.callback(up.stop)
        gws = {}
        for name, coalesce in (("no-coalesce", False), ("followed", True)):
            cfg = cache_config(up.url, coalesce=coalesce)
            gw = ServerThread(lambda cfg=cfg: build_app(Settings.model_validate(cfg))).start()
            stack.callback(gw.stop)
            gws[name] = gw.url
        targets = {"direct": up.url, **gws}
        print(
            f"{args.rounds} rounds, 1 leader + {args.followers} identical followers each "
            "(leader: first event at ~0.3 s, ~16 events 0.1 s apart)"
        )
        print("| target | follower first byte p50 / p95 / p99 ms | last byte p50 / p95 / p99 ms "
              "| upstream calls per round |")  # fmt: skip
        print("|---|---|---|---|")
        for name, url in targets.items():
            r = asyncio.run(run(url, up.url, args.rounds, args.followers, name))
            f = " / ".join(f"{pct(r['ttfb'], q) * 1000:.0f}" for q in (0.5, 0.95, 0.99))
            last = " / ".join(f"{pct(r['ttlb'], q) * 1000:.0f}" for q in (0.5, 0.95, 0.99))
            print(f"| {name} | {f} | {last} | {r['calls']:.1f} |")


if __name__ == "__main__":
    main()
