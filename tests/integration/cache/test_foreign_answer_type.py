"""A 2xx whose Content-Type is not the kind of answer the route serves (a captive portal's
login page, a misconfigured replica's text/html) goes to the client that asked, once: it is not
stored, not shared with the flight's waiters, and counted in
`latentgate_cache_stores_total{tier="all",result="content-type"}`. Before, it was stored and
replayed to every later identical request until the TTL. The route's own answers (JSON, an
event stream when the call streams, v2's binary tensors) are stored as before."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Callable, Iterator

import aiohttp
import openai
import pytest
from aiohttp import web

from tests.integration.cache.conftest import cache_config
from tests.support.sdk_clients import close_tracked_clients, track  # noqa: F401 (autouse)
from tests.support.servers import ServerThread, running

PORTAL = b"<html><body>Sign in to the hotel Wi-Fi</body></html>"
CHAT = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "a real answer"},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4},
}
INFER = {
    "model_name": "m",
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [1], "data": [2]}],
}


class Portal:
    """An upstream that answers every call with a 200 text/html page while `html` is set (one
    body, or chunked when the call streams), and with the route's own answer after."""

    def __init__(self) -> None:
        self.html = True
        self.calls = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.calls += 1
        doc = await request.json()
        if self.html:
            if not doc.get("stream"):
                return web.Response(body=PORTAL, content_type="text/html")
            resp = web.StreamResponse(headers={"Content-Type": "text/html; charset=utf-8"})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            for part in (PORTAL[:20], PORTAL[20:]):
                await resp.write(part)
            await resp.write_eof()
            return resp
        return web.json_response(INFER if request.path.startswith("/v2/") else CHAT)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self.handle)
        return app


@pytest.fixture
def portal() -> Iterator[tuple[Portal, ServerThread]]:
    up = Portal()
    with running(up.app) as server:
        yield up, server


def _not_stored(gw: ServerThread) -> float:
    with urllib.request.urlopen(f"{gw.url}/metrics", timeout=10) as r:
        text = r.read().decode()
    m = re.search(r'latentgate_cache_stores_total\{result="content-type",tier="all"\} (\S+)', text)
    return float(m.group(1)) if m else 0.0


def test_an_html_200_on_a_chat_route_reaches_its_client_and_is_never_replayed(
    portal: tuple[Portal, ServerThread], start_gateway: Callable[..., ServerThread]
) -> None:
    up, server = portal
    gw = start_gateway(cache_config(server.url, tiers=["memory"]))
    c = track(openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0))
    kw = {"model": "m", "messages": [{"role": "user", "content": "q"}], "temperature": 0}
    for n in (1, 2):
        raw = c.chat.completions.with_raw_response.create(**kw)  # type: ignore[call-overload]
        assert raw.headers["content-type"].startswith("text/html")
        assert raw.http_response.content == PORTAL  # the asking client gets the page
        assert (raw.headers["X-Cache"], up.calls) == ("miss", n)  # before: a hit on it
    assert _not_stored(gw) == 2
    up.html = False  # the route's own answers are stored as before
    first = c.chat.completions.with_raw_response.create(**kw)  # type: ignore[call-overload]
    assert first.parse().choices[0].message.content == "a real answer"
    again = c.chat.completions.with_raw_response.create(**kw)  # type: ignore[call-overload]
    assert (first.headers["X-Cache"], again.headers["X-Cache"], up.calls) == ("miss", "hit", 3)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "q"}], "stream": True,
             "temperature": 0},
        ),
        ("/v2/models/m/infer", {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1],
                                            "data": [1]}]}),
    ],
    ids=["chat-stream", "v2-infer"],
)  # fmt: skip
async def test_an_html_200_streamed_or_on_v2_is_not_stored(
    portal: tuple[Portal, ServerThread],
    start_gateway: Callable[..., ServerThread],
    path: str,
    body: dict[str, object],
) -> None:
    up, server = portal
    gw = start_gateway(cache_config(server.url, tiers=["memory"]))
    async with aiohttp.ClientSession(gw.url) as c:
        for n in (1, 2):
            async with c.post(path, json=body) as r:
                assert (r.status, await r.read()) == (200, PORTAL)
                assert (r.headers["X-Cache"], up.calls) == ("miss", n)
        assert _not_stored(gw) == 2
        if "stream" in body:
            return  # (a JSON answer to a streamed call is another test's matter)
        up.html = False
        xs = []
        for _ in range(2):
            async with c.post(path, json=body) as r:
                xs.append(r.headers["X-Cache"])
        assert (xs, up.calls) == (["miss", "hit"], 3)
