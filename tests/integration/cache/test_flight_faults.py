"""A fault between a leader's answer and its entry (building, sealing or storing it) closes the
flight with it. Before, the flight stayed open for good: every later identical request waited
out `coalesce_wait_s` on a flight no one would settle, then fetched its own answer, and the key
was never cached again for the process's life. The fault is injected where no input can reach
today (an entry's seal raising) because the one input that did (an answer nested past orjson's
depth) is fixed; the rule guards the next one."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from gateway.render import Framing
from tests.integration.cache.conftest import ADMIN_TOKEN, cache_config
from tests.support.servers import ServerThread

CHAT = {"model": "m", "messages": [{"role": "user", "content": "one two"}], "temperature": 0}


def _post(url: str) -> tuple[int, str | None]:
    req = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(CHAT).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()
            return r.status, r.headers.get("X-Cache")
    except urllib.error.HTTPError as err:
        err.read()
        return err.code, err.headers.get("X-Cache")


def _in_flight(url: str) -> int:
    req = urllib.request.Request(
        url + "/admin/cache/stats", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return int(json.loads(r.read())["in_flight"])


def test_a_fault_after_the_answer_closes_the_flight(
    upstream: ServerThread,
    start_gateway: Callable[..., ServerThread],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gw = start_gateway(cache_config(upstream.url, tiers=["memory"], routes=("chat",)))
    seal = Framing.seal
    faults = [RuntimeError("an unforeseen fault while sealing the entry")]

    def faulty(self: Framing, content_type: str, data: bytes) -> Any:
        if faults:
            raise faults.pop()
        return seal(self, content_type, data)

    monkeypatch.setattr(Framing, "seal", faulty)
    status, _ = _post(gw.url)
    assert status == 500
    assert _in_flight(gw.url) == 0  # before: 1, for the process's life
    # and the key is cached again: asked, stored, then a hit
    assert _post(gw.url) == (200, "miss")
    assert _post(gw.url) == (200, "hit")
