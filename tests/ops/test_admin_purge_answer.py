"""The purge answer is what docs/admin-openapi.yaml says, Redis up or down. Before, the document
said `{"purged": <integer>}` while the gateway answered an object per place (memory, semantic,
redis, other_workers, other_processes), so a script written from the document broke."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.integration.cache.conftest import ADMIN_TOKEN, cache_config
from tests.ops.conftest import http_json
from tests.support.servers import GatewayProcess, RedisServer, ServerThread

OPENAPI = Path(__file__).resolve().parents[2] / "docs" / "admin-openapi.yaml"


def _documented() -> dict[str, Any]:
    doc = yaml.safe_load(OPENAPI.read_text())
    answers = doc["paths"]["/admin/cache/purge"]["post"]["responses"]
    refs = {answers[s]["content"]["application/json"]["schema"]["$ref"] for s in ("200", "202")}
    assert refs == {"#/components/schemas/PurgeAnswer"}  # the same answer, done or not yet
    schema: dict[str, Any] = doc["components"]["schemas"]["PurgeAnswer"]
    return dict(schema["properties"]["purged"])


def _conforms(purged: Any, schema: dict[str, Any]) -> None:
    assert isinstance(purged, dict), purged
    assert set(schema["required"]) <= set(purged), purged
    assert set(purged) <= set(schema["properties"]), purged
    assert isinstance(purged["memory"], int)
    if "redis" in purged:
        assert isinstance(purged["redis"], int) or isinstance(purged["redis"]["error"], str)
    for told in purged.get("other_workers", {}).values():
        assert isinstance(told, int | str)
    assert isinstance(purged.get("other_processes", ""), str)


def test_the_purge_answer_is_as_documented(
    upstream: ServerThread, gateway_process: Callable[..., GatewayProcess]
) -> None:
    schema = _documented()
    redis = RedisServer().start()
    try:
        gw = gateway_process(cache_config(upstream.url, redis.url), workers=2)
        auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        chat = {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 0}
        assert http_json("POST", gw.url + "/v1/chat/completions", chat)[0] == 200
        status, body = http_json("POST", gw.url + "/admin/cache/purge", {"all": True}, auth)
        assert status == 200, body
        _conforms(body["purged"], schema)
        assert isinstance(body["purged"]["redis"], int) and "other_workers" in body["purged"]
        redis.kill()  # Redis gone: 202 (not done yet: retried), and the answer says what failed
        status, body = http_json("POST", gw.url + "/admin/cache/purge", {"all": True}, auth)
        assert status == 202, body
        _conforms(body["purged"], schema)
        assert "error" in body["purged"]["redis"], json.dumps(body)
        assert body["purged"]["redis"]["retrying"] is True
    finally:
        redis.stop()
