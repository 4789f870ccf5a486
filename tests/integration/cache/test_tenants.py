"""Tenant isolation through the real gateway: every credential header a client of these APIs
sends partitions exact and semantic hits, with real openai.OpenAI / openai.AzureOpenAI clients
and a real Redis whose contents reveal no credential."""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import redis

from gateway.app import build_app
from gateway.config import Settings
from tests.integration.cache.conftest import ADMIN_TOKEN, cache_config
from tests.support.servers import RedisServer, ServerThread
from tests.support.upstream import build_upstream

QUESTION = "How do I reset my password?"
PARAPHRASE = "How can I reset my password?"


def _config(upstream_url: str, redis_url: str) -> dict[str, Any]:
    cfg = cache_config(upstream_url, redis_url, routes=("chat",))
    cfg["cache"]["tenant_secret"] = "test-deployment-secret-" + uuid.uuid4().hex
    for r in cfg["routes"]:
        if r["name"] == "chat":
            r["cache"]["exact"]["key"] = {"tenant_headers": ["X-Tenant"]}
            r["cache"]["semantic"] = {"enabled": True}
    azure = {
        "name": "azure-chat",
        "match": {"prefix": "/openai/deployments/", "methods": ["POST"]},
        "protocol": "openai",
        "backend": "upstream",
        "cache": {"exact": {"enabled": True, "ttl": 60}, "semantic": {"enabled": True}},
    }
    cfg["routes"].insert(0, azure)
    return cfg


@pytest.fixture(scope="module")
def gw(redis_server: RedisServer) -> Iterator[ServerThread]:
    """One gateway for the module (the embedder loads once); each test clears the cache first."""
    up = ServerThread(build_upstream).start()
    settings = Settings.model_validate(_config(up.url, redis_server.url))
    server = ServerThread(lambda: build_app(settings)).start()
    yield server
    server.stop()
    up.stop()


@pytest.fixture(autouse=True)
def _empty_cache(gw: ServerThread) -> None:
    req = urllib.request.Request(
        f"{gw.url}/admin/cache/purge",
        data=b'{"all": true}',
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200


def _ask(client: openai.OpenAI, text: str = QUESTION) -> tuple[str, str]:
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": text}], temperature=0
    )
    return raw.parse().choices[0].message.content or "", raw.headers["x-cache"]


def _oa(url: str, key: str = "sk-alice", **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, **kw)


def _azure(
    url: str, key: str, deployment: str | None = None, version: str = "2024-06-01"
) -> openai.AzureOpenAI:
    return openai.AzureOpenAI(
        azure_endpoint=url,
        api_key=key,
        api_version=version,
        azure_deployment=deployment,
        max_retries=0,
    )


def _raw(url: str, headers: dict[str, str], text: str = QUESTION) -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "temperature": 0}
    req = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return str(resp.headers["X-Cache"])


def test_openai_keys_organizations_and_projects_are_tenants(gw: ServerThread) -> None:
    assert _ask(_oa(gw.url, "sk-alice"))[1] == "miss"
    assert _ask(_oa(gw.url, "sk-alice"))[1] == "hit"
    assert _ask(_oa(gw.url, "sk-bob"))[1] == "miss"
    assert _ask(_oa(gw.url, "sk-alice", organization="org-a"))[1] == "miss"
    assert _ask(_oa(gw.url, "sk-alice", organization="org-b"))[1] == "miss"
    assert _ask(_oa(gw.url, "sk-alice", organization="org-a"))[1] == "hit"
    assert _ask(_oa(gw.url, "sk-alice", organization="org-a", project="p1"))[1] == "miss"
    assert _ask(_oa(gw.url, "sk-alice", organization="org-a", project="p2"))[1] == "miss"


def test_azure_api_key_is_a_tenant(gw: ServerThread) -> None:
    assert _ask(_azure(gw.url, "az-key-1"))[1] == "miss"
    assert _ask(_azure(gw.url, "az-key-1"))[1] == "hit"
    assert _ask(_azure(gw.url, "az-key-2"))[1] == "miss"
    # a paraphrase from the other key is not served either; from the same key it is
    assert _ask(_azure(gw.url, "az-key-3"), PARAPHRASE)[1] == "miss"
    assert _ask(_azure(gw.url, "az-key-1"), PARAPHRASE)[1] == "semantic-hit"


def test_deployments_and_api_versions_never_share_answers(gw: ServerThread) -> None:
    """One key, one model name: another Azure deployment (the path) or api-version (the query)
    is another model or API, so neither an exact nor a semantic hit crosses them."""
    prod = _azure(gw.url, "az-key-1", "gpt-4o-prod")
    assert _ask(prod)[1] == "miss"
    assert _ask(prod)[1] == "hit"
    assert _ask(_azure(gw.url, "az-key-1", "gpt-35-cheap"))[1] == "miss"
    assert _ask(_azure(gw.url, "az-key-1", "gpt-4o-mini"), PARAPHRASE)[1] == "miss"
    assert _ask(_azure(gw.url, "az-key-1", "gpt-4o-prod", "2024-10-21"))[1] == "miss"
    assert _ask(prod, PARAPHRASE)[1] == "semantic-hit"
    # on /v1 too: a query some servers read (a key, a version) is part of the request
    assert _ask(_oa(gw.url, default_query={"v": "1"}))[1] == "miss"
    assert _ask(_oa(gw.url, default_query={"v": "2"}))[1] == "miss"
    assert _ask(_oa(gw.url, default_query={"v": "1"}))[1] == "hit"


def test_x_api_key_no_credentials_and_configured_extras(gw: ServerThread) -> None:
    assert _raw(gw.url, {"x-api-key": "ant-1"}) == "miss"
    assert _raw(gw.url, {"x-api-key": "ant-1"}) == "hit"
    assert _raw(gw.url, {"x-api-key": "ant-2"}) == "miss"
    assert _raw(gw.url, {}) == "miss"  # no credentials: a partition of its own
    assert _raw(gw.url, {}) == "hit"
    assert _raw(gw.url, {}, PARAPHRASE) == "semantic-hit"
    assert _raw(gw.url, {"x-api-key": "ant-3"}, PARAPHRASE) == "miss"
    # the route's X-Tenant adds to the credentials, it does not replace them
    assert _raw(gw.url, {"x-api-key": "ant-1", "X-Tenant": "blue"}) == "miss"
    assert _raw(gw.url, {"x-api-key": "ant-1", "X-Tenant": "green"}) == "miss"
    assert _raw(gw.url, {"x-api-key": "ant-1", "X-Tenant": "blue"}) == "hit"


def test_a_paraphrase_from_another_tenant_is_not_served(gw: ServerThread) -> None:
    alice = _oa(gw.url, "sk-alice", organization="org-a")
    first, x = _ask(alice)
    assert x == "miss"
    assert _ask(_oa(gw.url, "sk-bob", organization="org-a"), PARAPHRASE)[1] == "miss"
    assert _ask(_oa(gw.url, "sk-alice", organization="org-b"), PARAPHRASE)[1] == "miss"
    again, x = _ask(alice, PARAPHRASE)
    assert x == "semantic-hit" and again == first


def test_redis_contents_reveal_no_credential(gw: ServerThread, redis_server: RedisServer) -> None:
    secrets_sent = ["sk-unique-cred-7f3a", "az-unique-cred-9b2c", "org-unique-cred-1d4e"]
    assert _ask(_oa(gw.url, secrets_sent[0], organization=secrets_sent[2]))[1] == "miss"
    assert _ask(_azure(gw.url, secrets_sent[1]))[1] == "miss"
    assert _raw(gw.url, {"x-api-key": "ant-unique-cred-5e6f"}) == "miss"
    secrets_sent.append("ant-unique-cred-5e6f")
    r = redis.Redis.from_url(redis_server.url)
    dump = b""
    keys = list(r.scan_iter(count=1000))
    assert keys, "the entries were stored in Redis"
    for k in keys:
        dump += k
        kind = r.type(k)
        if kind == b"string":
            dump += r.get(k) or b""
        elif kind == b"stream":
            for _, fields in r.xrange(k):
                dump += b"".join(a + b for a, b in fields.items())
        elif kind == b"hash":
            dump += b"".join(a + b for a, b in r.hgetall(k).items())
        elif kind == b"zset":
            dump += b"".join(m for m, _ in r.zrange(k, 0, -1, withscores=True))
        elif kind == b"set":
            dump += b"".join(r.smembers(k))
    for s in secrets_sent:
        assert s.encode() not in dump and s.split("-", 1)[1].encode() not in dump
