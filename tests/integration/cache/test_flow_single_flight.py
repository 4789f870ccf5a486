"""Single flight holds on every cached route of the default config, semantic ones included.

Before the flow moved into cache/, a burst of identical chat requests on the default config
made 4-5 upstream calls: requests that checked the exact tier just before the leader stored,
then spent milliseconds embedding, reached the coalescer after the flight had closed. No
artificial upstream delay here: that is the case that leaked.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import aiohttp
import pytest
import redis

from gateway.app import build_app
from gateway.config import load_settings
from tests.local.conftest import wait_ready
from tests.support.servers import ROOT, RedisServer, ServerThread
from tests.support.upstream import build_upstream

N = 200


@pytest.fixture
def fresh_upstream() -> Iterator[ServerThread]:
    server = ServerThread(build_upstream).start()
    yield server
    server.stop()


def _default_gateway(upstream: ServerThread, redis_url: str = "") -> ServerThread:
    env = {
        "LATENTGATE_UPSTREAM": upstream.url,
        "LATENTGATE_REDIS_URL": redis_url,
        "LATENTGATE_GRPC_PORT": "0",  # the OS picks: 8001 may be taken on a shared machine
    }
    settings = load_settings(ROOT / "config/latentgate.yaml", environ=env)
    server = ServerThread(lambda: build_app(settings)).start()
    wait_ready(server.url)
    return server


async def _burst(url: str, path: str, body: dict[str, object]) -> list[tuple[int, str, bytes]]:
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=60)) as s:

        async def one() -> tuple[int, str, bytes]:
            async with s.post(url + path, json=body) as r:
                return r.status, r.headers.get("X-Cache", ""), await r.read()

        return await asyncio.gather(*(one() for _ in range(N)))


async def _calls(upstream: ServerThread, path: str) -> int:
    async with aiohttp.ClientSession() as s, s.get(upstream.url + "/_test/stats") as r:
        return int((await r.json())["requests"].get(path, 0))


def _chat(text: str, stream: bool = False) -> dict[str, object]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": text}],
        "temperature": 0,
        "stream": stream,
    }


@pytest.mark.slow
@pytest.mark.parametrize("with_redis", [False, True], ids=["memory", "redis"])
async def test_identical_burst_on_every_default_cached_route_makes_one_upstream_call(
    fresh_upstream: ServerThread, redis_server: RedisServer, with_redis: bool
) -> None:
    redis_url = ""
    if with_redis:
        redis_url = redis_server.url.rsplit("/", 1)[0] + "/6"  # a db of its own, emptied first
        client = redis.Redis.from_url(redis_url)
        client.flushdb()
        client.close()
    gw = _default_gateway(fresh_upstream, redis_url)
    try:
        cases = [
            ("/v1/chat/completions", _chat("what is the capital of france, briefly?")),
            ("/v1/completions", {"model": "m", "prompt": "one flight please", "temperature": 0}),
            ("/v1/embeddings", {"model": "text-embedding-3-small", "input": "one flight"}),
        ]
        for path, body in cases:
            results = await _burst(gw.url, path, body)
            assert {status for status, _, _ in results} == {200}, path
            assert len({payload for _, _, payload in results}) == 1, path
            assert await _calls(fresh_upstream, path) == 1, path
            assert sum(x == "miss" for _, x, _ in results) >= 1
    finally:
        gw.stop()


@pytest.mark.slow
async def test_identical_streamed_burst_one_call_every_client_gets_the_whole_stream(
    fresh_upstream: ServerThread,
) -> None:
    gw = _default_gateway(fresh_upstream)
    try:
        results = await _burst(gw.url, "/v1/chat/completions", _chat("stream it once", True))
        assert {status for status, _, _ in results} == {200}
        assert await _calls(fresh_upstream, "/v1/chat/completions") == 1
        texts = set()
        for _, _, payload in results:
            events = [e for e in payload.split(b"\n\n") if e.startswith(b"data: ")]
            assert events[-1] == b"data: [DONE]"
            deltas = [json.loads(e[6:])["choices"] for e in events[:-1]]
            texts.add("".join(c[0]["delta"].get("content") or "" for c in deltas if c))
        assert len(texts) == 1 and texts != {""}
    finally:
        gw.stop()
