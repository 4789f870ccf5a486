"""Google's and Azure API Management's credential headers partition the cache: two clients whose
key (or project) differs never share a cached answer.

google-genai sends its key as `x-goog-api-key`; the key picks the project whose files and
cached contents a request reads. A Google OAuth token acts in the project its client names in
`x-goog-user-project`. Azure OpenAI behind API Management is called with the
subscription key in `Ocp-Apim-Subscription-Key` (`openai.AzureOpenAI(default_headers=...)`);
the subscription picks the product, its quota and the deployment behind it. The upstream here
answers from each key's own documents; before, none of these headers was part of the tenant, and the
second key was served the first one's cached answer (a hit, without the upstream seeing it).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Iterator

import openai
import pytest
from aiohttp import web

from tests.integration.cache.conftest import cache_config
from tests.support.servers import ServerThread, running

CALLS = web.AppKey("calls", list)
# what the file `report` says in each key's project, and which deployment each subscription's
# product reaches
PROJECTS = {"AIza-alpha": "alpha's revenue was 10", "AIza-beta": "beta's revenue was 99"}
OAUTH_PROJECTS = {"proj-alpha": "AIza-alpha", "proj-beta": "AIza-beta"}
PRODUCTS = {"sub-gold": "gpt-4o (gold product)", "sub-free": "gpt-4o-mini (free product)"}


async def _generate(request: web.Request) -> web.Response:
    request.app[CALLS].append(request.path)
    key = request.headers.get("x-goog-api-key")
    if key is None and request.headers.get("Authorization") == "Bearer ya29.token":
        # an OAuth token acts in the project its client names
        key = OAUTH_PROJECTS.get(request.headers.get("x-goog-user-project", ""))
    doc = PROJECTS.get(key or "")
    if doc is None:
        return web.json_response({"error": {"code": 403, "status": "PERMISSION_DENIED"}}, 403)
    part = {"text": doc}
    return web.json_response(
        {"candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP"}]}
    )


async def _chat(request: web.Request) -> web.Response:
    request.app[CALLS].append(request.path)
    product = PRODUCTS.get(request.headers.get("Ocp-Apim-Subscription-Key", ""))
    if product is None:
        return web.json_response({"statusCode": 401, "message": "invalid subscription"}, 401)
    message = {"role": "assistant", "content": f"answered by {product}"}
    return web.json_response(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "gpt-4o",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        }
    )


def _upstream() -> web.Application:
    app = web.Application()
    app[CALLS] = []
    app.router.add_post("/v1beta/models/{method}", _generate)
    app.router.add_post("/openai/deployments/{deployment}/chat/completions", _chat)
    return app


@pytest.fixture
def upstream() -> Iterator[ServerThread]:
    with running(_upstream) as server:
        yield server


@pytest.fixture
def gw(upstream: ServerThread, start_gateway: Callable[..., ServerThread]) -> ServerThread:
    cfg = cache_config(upstream.url, tiers=["memory"], routes=("default",))
    azure = {
        "name": "azure-chat",
        "match": {"prefix": "/openai/deployments/", "methods": ["POST"]},
        "protocol": "openai",
        "backend": "upstream",
        "cache": {"exact": {"enabled": True, "ttl": 60, "tiers": ["memory"]}},
    }
    cfg["routes"].insert(0, azure)
    return start_gateway(cfg)


def _gemini(url: str, key: str = "", project: str = "") -> tuple[str, str]:
    """generateContent as google-genai sends it: the key in x-goog-api-key, or an OAuth token
    and the project it acts in (x-goog-user-project)."""
    creds = (
        {"x-goog-api-key": key}
        if key
        else {"Authorization": "Bearer ya29.token", "x-goog-user-project": project}
    )
    body = {"contents": [{"role": "user", "parts": [{"text": "What does report say?"}]}]}
    req = urllib.request.Request(
        f"{url}/v1beta/models/gemini-2.0-flash:generateContent",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **creds},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        doc = json.loads(resp.read())
        return doc["candidates"][0]["content"]["parts"][0]["text"], resp.headers["X-Cache"]


def _apim(url: str, subscription: str) -> tuple[str, str]:
    client = openai.AzureOpenAI(
        azure_endpoint=url,
        api_key="unused-behind-apim",
        api_version="2024-06-01",
        azure_deployment="chat",
        default_headers={"Ocp-Apim-Subscription-Key": subscription},
        max_retries=0,
    )
    with client:
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=[{"role": "user", "content": "Which model are you?"}], seed=1
        )
        return raw.parse().choices[0].message.content or "", raw.headers["x-cache"]


def test_another_gemini_key_is_another_tenant(gw: ServerThread, upstream: ServerThread) -> None:
    assert _gemini(gw.url, "AIza-alpha") == ("alpha's revenue was 10", "miss")
    assert _gemini(gw.url, "AIza-alpha") == ("alpha's revenue was 10", "hit")
    # before: ("alpha's revenue was 10", "hit"), beta's request never reached the upstream
    assert _gemini(gw.url, "AIza-beta") == ("beta's revenue was 99", "miss")
    assert _gemini(gw.url, "AIza-beta") == ("beta's revenue was 99", "hit")
    assert upstream.app is not None and len(upstream.app[CALLS]) == 2


def test_one_oauth_token_in_another_project_is_another_tenant(
    gw: ServerThread, upstream: ServerThread
) -> None:
    assert _gemini(gw.url, project="proj-alpha") == ("alpha's revenue was 10", "miss")
    assert _gemini(gw.url, project="proj-alpha") == ("alpha's revenue was 10", "hit")
    # before: ("alpha's revenue was 10", "hit")
    assert _gemini(gw.url, project="proj-beta") == ("beta's revenue was 99", "miss")
    assert upstream.app is not None and len(upstream.app[CALLS]) == 2


def test_another_apim_subscription_is_another_tenant(
    gw: ServerThread, upstream: ServerThread
) -> None:
    assert _apim(gw.url, "sub-gold") == ("answered by gpt-4o (gold product)", "miss")
    assert _apim(gw.url, "sub-gold")[1] == "hit"
    # before: the gold product's answer, a hit, for a free subscription
    assert _apim(gw.url, "sub-free") == ("answered by gpt-4o-mini (free product)", "miss")
    assert upstream.app is not None and len(upstream.app[CALLS]) == 2
