"""Server-Timing names what ran: `parse` on every cached answer (the byte-alias fast path too),
`upstream` for a replica's time and `engine` for a local model's (never `upstream`)."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp

from gateway.app import build_app
from gateway.config import load_settings
from tests.integration.cache.conftest import cache_config
from tests.local.conftest import wait_ready
from tests.support.servers import ROOT, ServerThread


def _stages(header: str) -> list[str]:
    return [part.split(";", 1)[0].strip() for part in header.split(",")]


async def _post(url: str, body: dict[str, object]) -> tuple[str, str]:
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
        await r.read()
        return r.headers["X-Cache"], r.headers["Server-Timing"]


async def test_parse_is_there_on_a_miss_and_on_both_hit_paths(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))
    body = {"model": "m", "messages": [{"role": "user", "content": "time me"}], "temperature": 0}
    url = gw.url + "/v1/chat/completions"
    x1, t1 = await _post(url, body)
    x2, t2 = await _post(url, body)  # the same bytes: the alias fast path
    assert (x1, x2) == ("miss", "hit")
    assert _stages(t1) == ["parse", "cache", "upstream", "total"]
    assert _stages(t2) == ["parse", "cache", "total"]
    # other bytes, same key (reordered fields): a parsed hit
    x3, t3 = await _post(url, dict(reversed(list(body.items()))))
    assert x3 == "hit" and _stages(t3) == ["parse", "cache", "total"]


async def test_a_local_models_time_is_engine(upstream: ServerThread) -> None:
    env = {"LATENTGATE_UPSTREAM": upstream.url, "LATENTGATE_GRPC_PORT": "0"}
    settings = load_settings(ROOT / "config/latentgate.yaml", environ=env)
    gw = ServerThread(lambda: build_app(settings)).start()
    try:
        wait_ready(gw.url)
        body = {"model": "all-MiniLM-L6-v2", "input": "timed locally"}
        x, timing = await _post(gw.url + "/v1/embeddings", body)
        assert x == "miss" and "engine" in _stages(timing) and "upstream" not in _stages(timing)
        x, timing = await _post(gw.url + "/v1/chat/completions", {
            "model": "m", "messages": [{"role": "user", "content": "remote"}], "temperature": 0
        })  # fmt: skip
        assert "upstream" in _stages(timing) and "engine" not in _stages(timing)
    finally:
        gw.stop()
