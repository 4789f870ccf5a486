"""Shared fixtures: a real test upstream, a real Redis server, and gateways built from config."""

from __future__ import annotations

import contextlib
import os
import tempfile
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from redis.asyncio import Redis

from gateway.app import build_app
from gateway.codings import SERVER_OPTIONS
from gateway.config import Settings
from tests.support.servers import RedisServer, ServerThread
from tests.support.upstream import build_upstream


@pytest.fixture(autouse=True)
def own_state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each test's gateways (in process, and the processes it starts, which inherit the
    environment) keep their journal of waiting Redis deletes in the test's own directory: a
    test never replays another's deletes on a shared Redis (cache.tiers.delete_journal)."""
    monkeypatch.setenv("LATENTGATE_STATE_DIR", str(tmp_path / "state"))


@pytest.fixture(autouse=True)
def close_sdk_clients(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every OpenAI / Anthropic SDK client a test makes is closed when the test ends. A client
    holds keep-alive sockets, and one caught in a reference cycle would be collected, its
    socket unclosed, during some later test, whose ResourceWarning then fails that test."""
    made: weakref.WeakSet[Any] = weakref.WeakSet()
    for cls in (openai.OpenAI, anthropic.Anthropic):
        init = cls.__init__

        def tracked(self: Any, *args: Any, __init: Any = init, **kwargs: Any) -> None:
            __init(self, *args, **kwargs)
            made.add(self)

        monkeypatch.setattr(cls, "__init__", tracked)
    yield
    for client in list(made):
        client.close()


def base_config(upstream_url: str, **overrides: Any) -> dict[str, Any]:
    """The default routes pointed at one upstream; tests override what they exercise."""
    cfg: dict[str, Any] = {
        "backends": {
            "upstream": {
                "kind": "remote",
                "replicas": [upstream_url],
                "timeouts": {"connect": 1, "read": 5, "total": 10},
            }
        },
        "routes": [
            {
                "name": "chat",
                "match": {"path": "/v1/chat/completions", "methods": ["POST"]},
                "protocol": "openai",
                "backend": "upstream",
            },
            {
                "name": "completions",
                "match": {"path": "/v1/completions", "methods": ["POST"]},
                "protocol": "openai",
                "backend": "upstream",
            },
            {
                "name": "embeddings",
                "match": {"path": "/v1/embeddings", "methods": ["POST"]},
                "protocol": "openai",
                "backend": "upstream",
            },
            {"name": "v2", "match": {"prefix": "/v2/"}, "protocol": "v2", "backend": "upstream"},
            {
                "name": "default",
                "match": {"prefix": "/"},
                "protocol": "passthrough",
                "backend": "upstream",
            },
        ],
    }
    cfg.update(overrides)
    return cfg


@pytest.fixture
def upstream() -> Iterator[ServerThread]:
    server = ServerThread(build_upstream).start()
    yield server
    server.stop()


@pytest.fixture
def start_gateway() -> Iterator[Callable[..., ServerThread]]:
    """start_gateway(config_dict, uds=None) → a running in-process gateway (own thread and loop)."""
    started: list[ServerThread] = []

    def start(config: dict[str, Any], uds: str | None = None) -> ServerThread:
        settings = Settings.model_validate(config)
        # the gateway's own server options (request bodies reach it as sent, as in `serve`)
        server = ServerThread(
            lambda: build_app(settings), uds=uds, runner_kwargs=SERVER_OPTIONS
        ).start()
        started.append(server)
        return server

    yield start
    for s in started:
        s.stop()


@pytest.fixture
def gateway(upstream: ServerThread, start_gateway: Callable[..., ServerThread]) -> ServerThread:
    return start_gateway(base_config(upstream.url))


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
async def own_redis() -> AsyncIterator[tuple[RedisServer, Redis]]:
    """A Redis server of the test's own, and an admin client on it: for a test that pauses it,
    or makes it refuse writes, which would stall or fail every test on the shared one."""
    server = RedisServer().start()
    admin = Redis.from_url(server.url)
    yield server, admin
    await admin.client_unpause()
    await admin.aclose()
    server.stop()


@pytest.fixture
def tmp_sock_dir() -> Iterator[str]:
    # Unix socket paths are limited to ~107 bytes: keep them short.
    d = tempfile.mkdtemp(prefix="lg-", dir="/tmp")
    yield d
    for f in os.listdir(d):
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(d, f))
    os.rmdir(d)
