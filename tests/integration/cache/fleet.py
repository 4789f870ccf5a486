"""Helpers for the tests that run sidecars as real `latentgate serve` processes on one Redis:
plain HTTP requests on new connections, the upstream's call counts, each process's memory tier,
and a bounded wait for a condition (never a fixed delay)."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from tests.integration.cache.conftest import ADMIN_TOKEN
from tests.support.servers import GatewayProcess, ServerThread

ALICE = "Bearer sk-alice"
BOB = "Bearer sk-bob"
PATIENCE_S = 20.0


def request(
    url: str, method: str = "GET", auth: str = ALICE, body: bytes | None = None
) -> tuple[int, dict[str, str], Any]:
    # a new connection each: with --workers N, SO_REUSEPORT spreads them over the workers
    headers = {"Authorization": auth, "Connection": "close"}
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def get_json(url: str, auth: str | None = None) -> Any:
    headers = {"Authorization": auth} if auth else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
        return json.loads(r.read())


def upstream_calls(upstream: ServerThread, path: str) -> int:
    return int(get_json(upstream.url + "/_test/stats")["requests"].get(path, 0))


def memory_entries(gw: GatewayProcess) -> int:
    stats = get_json(gw.url + "/admin/cache/stats", f"Bearer {ADMIN_TOKEN}")
    return int(stats["tiers"]["memory"]["entries"])


WORKER_ENTRIES = re.compile(
    r'^latentgate_cache_entries\{tier="memory",worker="(\d+)"\} (\S+)$', re.MULTILINE
)


def entries_per_worker(gw: GatewayProcess) -> dict[str, int]:
    """Each worker's memory-tier entries, from the merged /metrics every worker answers."""
    with urllib.request.urlopen(gw.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {w: int(float(n)) for w, n in WORKER_ENTRIES.findall(text)}


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {PATIENCE_S:g}s: {what}"
        time.sleep(0.05)
