"""A reload that fails after it built new backends closes them and keeps serving the old
generation. Before, a failure in building the route caches answered 500 and left the new pool's
health checks dialling its replica for the process's life; a new local backend that could not
load left the pool built before it with its session open."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from aiohttp import web

from cache import Cache
from tests.ops.reload_support import InProcess, chat_upstream, two_backend_config
from tests.support.servers import ServerThread


class Replica:
    """A replica that counts the health checks it is sent."""

    def __init__(self) -> None:
        self.checks = 0
        self.server = ServerThread(self._app).start()

    def _app(self) -> web.Application:
        async def health(_: web.Request) -> web.Response:
            self.checks += 1
            return web.json_response({"ok": True})

        app = web.Application()
        app.router.add_get("/health", health)
        return app


@pytest.fixture
def replica() -> Iterator[Replica]:
    r = Replica()
    yield r
    r.server.stop()


def _with_third(cfg: dict[str, Any], replica: Replica, **pool: Any) -> dict[str, Any]:
    """A new health-checked pool, `third`, that the chat route moves to."""
    cfg["backends"]["third"] = {
        "kind": "remote",
        "replicas": [replica.server.url],
        "health_check": {"path": "/health", "interval_s": 0.05},
        **pool,
    }
    for route in cfg["routes"]:
        if route["name"] == "chat":
            route["backend"] = "third"
    return cfg


def _tasks(gw: InProcess) -> list[str]:
    async def names() -> list[str]:
        return sorted(t.get_name() for t in asyncio.all_tasks())

    return asyncio.run_coroutine_threadsafe(names(), gw.server.loop).result(10)


def test_a_reload_whose_route_caches_fail_closes_its_new_pool_and_keeps_serving(
    upstream: ServerThread,
    second_upstream: ServerThread,
    replica: Replica,
    in_process: Callable[..., InProcess],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = two_backend_config(upstream.url, second_upstream.url, "upstream")
    gw = in_process(cfg)
    assert chat_upstream(gw.server.url) == "up"

    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("route cache could not be built")

    monkeypatch.setattr(Cache, "for_route", broken)
    gw.write(
        _with_third(two_backend_config(upstream.url, second_upstream.url, "upstream"), replica)
    )
    status, body = gw.reload()
    assert status == 422, body  # before: 500
    assert body["ok"] is False and body["generation"] == 0
    assert body["errors"][0]["path"] == "routes"
    assert "route cache could not be built" in body["errors"][0]["message"]
    assert chat_upstream(gw.server.url) == "up"  # the old generation answers
    # the new pool is closed: no health check task dials its replica (before: every 50 ms)
    assert not [n for n in _tasks(gw) if n.startswith("third-")]
    assert replica.checks == 0


def test_a_reload_whose_local_backend_cannot_load_leaves_no_pool_session_open(
    upstream: ServerThread,
    second_upstream: ServerThread,
    replica: Replica,
    in_process: Callable[..., InProcess],
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = two_backend_config(upstream.url, second_upstream.url, "upstream")
    gw = in_process(cfg)
    new = _with_third(
        two_backend_config(upstream.url, second_upstream.url, "upstream"),
        replica,
        pool={"http_client": "aiohttp"},  # (a session per replica, opened when built)
    )
    # (built after `third`: the file's keys are sorted)
    new["backends"]["unloadable"] = {"kind": "onnxruntime", "model": "/nonexistent/model.onnx"}
    gw.write(new)
    # (its log record would hold the failure's traceback, and so what it built, past gc)
    caplog.set_level(logging.CRITICAL, logger="latentgate.reload")
    status, body = gw.reload()
    assert status == 422 and body["errors"][0]["path"] == "backends", body
    assert "does not exist" in body["errors"][0]["message"]
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        gc.collect()  # an unclosed aiohttp session says so when it is collected
    assert "Unclosed client session" not in caplog.text
    assert chat_upstream(gw.server.url) == "up"
