"""`stream: true` on an embeddings call is keyed: an embeddings answer has no stream framing.

OpenAI refuses `stream` on /v1/embeddings (400, an unrecognised argument); vLLM ignores it and
answers JSON. The key dropped `stream` on every kind, so a call with `stream: true` was a hit
on the plain call's entry: a 200 with vectors where the upstream itself answers 400.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import openai
import pytest
from aiohttp import web

from tests.integration.cache.conftest import cache_config
from tests.support.sdk_clients import close_tracked_clients, openai_client  # noqa: F401 (autouse)
from tests.support.servers import ServerThread, one_route, running


async def _embeddings(request: web.Request) -> web.Response:
    """As OpenAI answers: an argument it does not know is a 400."""
    body = await request.json()
    unknown = sorted(set(body) - {"model", "input", "encoding_format", "dimensions", "user"})
    if unknown:
        error = {"message": f"Unrecognized request argument supplied: {', '.join(unknown)}",
                 "type": "invalid_request_error", "param": None, "code": None}  # fmt: skip
        return web.json_response({"error": error}, status=400)
    data = [{"object": "embedding", "index": 0, "embedding": [0.25, -0.5]}]
    usage = {"prompt_tokens": 2, "total_tokens": 2}
    return web.json_response({"object": "list", "data": data, "model": "emb", "usage": usage})


@pytest.fixture
def upstream() -> Iterator[ServerThread]:
    with running(one_route("/v1/embeddings", _embeddings)) as server:
        yield server


def test_a_streamed_embeddings_call_is_not_the_plain_calls_hit(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"]))
    client = openai_client(gw.url)
    plain = client.embeddings.with_raw_response.create(model="emb", input="hi")
    assert plain.headers["X-Cache"] == "miss"
    assert (
        client.embeddings.with_raw_response.create(
            model="emb", input="hi", extra_body={"stream": False}
        ).headers["X-Cache"]
        == "hit"
    )  # (not streamed: the same call)
    with pytest.raises(openai.BadRequestError, match="Unrecognized request argument") as err:
        client.embeddings.create(model="emb", input="hi", extra_body={"stream": True})
    assert err.value.response.headers.get("X-Cache") != "hit"
