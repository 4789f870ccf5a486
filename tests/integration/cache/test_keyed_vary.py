"""An answer that Varies on a request header its route's key already holds is stored: the key
keeps apart the answers to each value of it (RFC 9111 4.1 asks no more). The Messages route keys
`anthropic-version` and `anthropic-beta`; an upstream that said `Vary: anthropic-beta` was never
stored before (`stores_total{result="vary"}`), each call went upstream. A Vary on a header the
key does not hold is still not stored."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp

from tests.conftest import base_config
from tests.integration.cache.conftest import anthropic_route
from tests.support.servers import ServerThread

BODY = {
    "model": "claude-test",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "which beta am I on"}],
}


async def _post(url: str, headers: dict[str, str]) -> tuple[str, str]:
    """X-Cache, and the request header value the upstream's answer was chosen for."""
    sent = {"x-api-key": "sk-ant-alice", "anthropic-version": "2023-06-01", **headers}
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/v1/messages", json=BODY, headers=sent) as r,
    ):
        await r.read()
        assert r.status == 200
        return r.headers["X-Cache"], r.headers["X-Varied-Value"]


async def test_a_vary_on_a_keyed_header_is_stored_per_value(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    cfg = base_config(upstream.url)
    cfg["routes"].insert(0, anthropic_route())
    gw = start_gateway(cfg)
    vary = {"X-Test-Vary": "anthropic-beta"}
    seen = []
    for _ in range(2):
        for beta in ("files-api-2025-04-14", "context-management-2025-06-27"):
            seen.append(await _post(gw.url, {**vary, "anthropic-beta": beta}))
    assert seen == [
        ("miss", "files-api-2025-04-14"),
        ("miss", "context-management-2025-06-27"),
        ("hit", "files-api-2025-04-14"),
        ("hit", "context-management-2025-06-27"),
    ]
    # a header the key does not hold: never stored, each value fetched again
    unkeyed = {"X-Test-Vary": "X-Team", "X-Team": "red"}
    assert [await _post(gw.url, unkeyed) for _ in range(2)] == [("miss", "red")] * 2
