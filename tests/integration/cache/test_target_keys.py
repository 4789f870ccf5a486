"""Two requests share a stored answer only when the upstream would read them as one request.

The query is keyed as it is sent upstream (raw): decoding it first made `?a=%2526` (a is the
text `%26`) and `?a=%26` (a is `&`) one key, and `?a+b` one with `?a%20b`, which an upstream that
does not read `+` as a space tells apart. So is the path, on every route: an OpenAI or Messages
route matches `/v1/chat%2Fcompletions` by its decoded form, which an upstream routing on the raw
path (aiohttp) does not. A passthrough body is keyed with its Content-Type: the
same bytes as `text/plain` and as JSON are two requests to a replica that reads its body by it.
An OpenAI or Messages key reads
a JSON body whatever its label, so it holds a label other than JSON or msgpack. Memory and Redis
tiers alike (the key is built before either is asked).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from tests.integration.cache.conftest import anthropic_route, cache_config
from tests.support.servers import RedisServer, ServerThread

PAIRS = [
    ("a=%26", "a=%2526"),  # a="&" and a="%26"
    ("a=%3D", "a=%253D"),  # a="=" and a="%3D"
    ("q=x+y", "q=x%20y"),  # a '+' is a space only to a form decoder
]


def _config(upstream: str, redis: RedisServer | None) -> dict[str, Any]:
    tier = "memory" if redis is None else "redis"
    cfg = cache_config(upstream, None if redis is None else redis.url, tiers=[tier])
    messages = anthropic_route()
    messages["cache"]["exact"]["tiers"] = [tier]
    cfg["routes"].insert(0, messages)
    return cfg


@pytest.fixture(params=["memory", "redis"])
def gw(
    request: pytest.FixtureRequest,
    upstream: ServerThread,
    start_gateway: Callable[..., ServerThread],
) -> ServerThread:
    redis = request.getfixturevalue("redis_server") if request.param == "redis" else None
    return start_gateway(_config(upstream.url, redis))


async def _get(url: str) -> tuple[str, str]:
    """(X-Cache, the raw path the upstream answered for)."""
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.headers.get("X-Cache", ""), (await r.json())["raw_path"]


async def _chat(url: str) -> tuple[str, str]:
    body = {"model": "m", "temperature": 0, "messages": [{"role": "user", "content": "q"}]}
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
        assert r.status == 200
        return r.headers.get("X-Cache", ""), (await r.read()).decode()


@pytest.mark.parametrize(("first", "second"), PAIRS)
async def test_a_passthrough_query_is_keyed_as_sent(
    gw: ServerThread, first: str, second: str
) -> None:
    path = f"/keys/{first.replace('%', '')}"
    assert await _get(f"{gw.url}{path}?{first}") == ("miss", f"{path}?{first}")
    # another query to the upstream: its own answer, never the first one's
    assert await _get(f"{gw.url}{path}?{second}") == ("miss", f"{path}?{second}")
    assert await _get(f"{gw.url}{path}?{first}") == ("hit", f"{path}?{first}")
    assert await _get(f"{gw.url}{path}?{second}") == ("hit", f"{path}?{second}")


async def test_an_openai_query_is_keyed_as_sent(gw: ServerThread) -> None:
    url = gw.url + "/v1/chat/completions?api-version="
    assert (await _chat(url + "%3D"))[0] == "miss"
    assert (await _chat(url + "%253D"))[0] == "miss"  # before: a hit for api-version "="
    assert (await _chat(url + "%253D"))[0] == "hit"


async def test_a_passthrough_body_is_keyed_with_its_content_type(gw: ServerThread) -> None:
    async def post(ctype: str) -> tuple[str, str | None]:
        async with (
            aiohttp.ClientSession() as s,
            s.post(gw.url + "/keys/typed", data=b'{"x": 1}', headers={"Content-Type": ctype}) as r,
        ):
            sent = dict(json.loads(await r.read())["headers"])
            return r.headers.get("X-Cache", ""), sent.get("Content-Type")

    assert await post("text/plain") == ("miss", "text/plain")
    assert await post("application/json") == ("miss", "application/json")
    assert await post("text/plain") == ("hit", "text/plain")
    assert await post("application/json") == ("hit", "application/json")


@pytest.mark.parametrize("path", ["/v1/chat%2Fcompletions", "/v1%2Fmessages"])
async def test_an_encoded_slash_in_an_api_path_is_another_key(gw: ServerThread, path: str) -> None:
    """The route matches the decoded path, but the upstream gets it as sent: to an aiohttp
    replica (as the test one) `/v1/chat%2Fcompletions` is not its chat endpoint, and its answer
    there (the echo) was stored under the chat key, then served to every plain chat client."""
    plain = path.replace("%2F", "/")
    body = {"model": "m", "max_tokens": 8, "temperature": 0}
    body["messages"] = [{"role": "user", "content": "encoded slash"}]

    async def post(p: str) -> tuple[str, str | None]:
        async with aiohttp.ClientSession() as s, s.post(gw.url + p, json=body) as r:
            doc = await r.json()
            return r.headers.get("X-Cache", ""), doc.get("raw_path")  # the echo's, or None

    assert await post(path) == ("miss", path)
    assert await post(plain) == ("miss", None)  # the API's own answer, not the echo
    assert await post(path) == ("hit", path)
    assert await post(plain) == ("hit", None)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings", "/v1/messages"])
async def test_a_json_body_sent_as_another_type_is_another_key(gw: ServerThread, path: str) -> None:
    """curl -d labels a JSON body application/x-www-form-urlencoded: the key read it as JSON,
    so it hit the JSON request's entry, where a replica that reads bodies by type (FastAPI,
    vLLM) answers 422. JSON (with or without a label, or +json) and msgpack share one key."""
    doc = {"model": "m", "max_tokens": 8, "temperature": 0, "input": "typed"}
    doc["messages"] = [{"role": "user", "content": "typed body"}]
    body = json.dumps(doc).encode()

    async def post(ctype: str) -> str:
        headers = {"Content-Type": ctype}
        async with (
            aiohttp.ClientSession() as s,
            s.post(gw.url + path, data=body, headers=headers) as r,
        ):
            assert r.status == 200
            return r.headers.get("X-Cache", "")

    assert await post("application/json") == "miss"
    assert await post("application/json; charset=utf-8") == "hit"
    assert await post("application/vnd.api+json") == "hit"
    assert await post("application/x-www-form-urlencoded") == "miss"
    assert await post("text/plain") == "miss"
    assert await post("Text/Plain; charset=utf-8") == "hit"
