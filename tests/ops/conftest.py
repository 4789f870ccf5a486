"""Fixtures for the operations tests: gateway processes built from config files on disk."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.support.servers import GatewayProcess, ServerThread
from tests.support.upstream import build_upstream

if TYPE_CHECKING:
    from tests.ops.reload_support import InProcess

ADMIN_TOKEN = "test-admin-token-0123456789"


def http(
    method: str,
    url: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10,
) -> tuple[int, dict[str, str], bytes]:
    """One plain request; returns (status, headers, body) for every status, errors included."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def http_json(
    method: str,
    url: str,
    payload: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10,
) -> tuple[int, Any]:
    data = json.dumps(payload).encode() if payload is not None else None
    h = {"Content-Type": "application/json", **(headers or {})}
    status, _, body = http(method, url, data, h, timeout)
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body


@pytest.fixture
def gateway_process() -> Iterator[Callable[..., GatewayProcess]]:
    """gateway_process(config_dict, workers=1, env=None) → a started `latentgate serve` process."""
    started: list[GatewayProcess] = []

    def start(config: dict[str, Any], **kwargs: Any) -> GatewayProcess:
        proc = GatewayProcess(config, **kwargs).start()
        started.append(proc)
        return proc

    yield start
    for p in started:
        p.stop()


@pytest.fixture
def second_upstream() -> Iterator[ServerThread]:
    """Another stand-in upstream (it answers X-Upstream: second): where a reload moves a route."""
    server = ServerThread(lambda: build_upstream("second")).start()
    yield server
    server.stop()


@pytest.fixture
def in_process() -> Iterator[Callable[[dict[str, Any]], InProcess]]:
    """in_process(config_dict) → a gateway served in-process from a config file it reloads."""
    from tests.ops.reload_support import InProcess  # (it imports this module's helpers)

    made: list[InProcess] = []

    def make(config: dict[str, Any]) -> InProcess:
        gw = InProcess(config)
        made.append(gw)
        return gw

    yield make
    for gw in made:
        gw.server.stop()
        Path(gw.path).unlink(missing_ok=True)
