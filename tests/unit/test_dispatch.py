"""The dispatch shortcut (gateway/dispatch.py) is on for the shipped config, and says so when a
config or app shape turns it off: it is about a tenth of a cache hit's CPU, and it once went off
silently after a refactor while every answer stayed the same."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from aiohttp import web

from gateway.app import build_app
from gateway.config import load_settings
from gateway.dispatch import model_traffic_handler
from gateway.state import STATE
from tests.unit.cache.test_config import close_backends

CONFIG = Path(__file__).resolve().parents[2] / "config" / "latentgate.yaml"


async def test_the_shipped_config_takes_the_shortcut(caplog: pytest.LogCaptureFixture) -> None:
    app = build_app(load_settings(CONFIG, environ={}))
    try:
        with caplog.at_level(logging.WARNING, "latentgate.dispatch"):
            handler = model_traffic_handler(app)
        assert handler != app._handle
        assert not [r for r in caplog.records if r.name == "latentgate.dispatch"]
    finally:
        await close_backends(app[STATE])


async def test_an_unknown_middleware_takes_the_full_way_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = build_app(load_settings(CONFIG, environ={}))

    @web.middleware
    async def extra(request: web.Request, handler: web.RequestHandler) -> web.StreamResponse:
        return await handler(request)

    app.middlewares.append(extra)
    try:
        with caplog.at_level(logging.WARNING, "latentgate.dispatch"):
            handler = model_traffic_handler(app)
        assert handler == app._handle
        assert "takes aiohttp's router and middlewares (middleware" in caplog.text
    finally:
        await close_backends(app[STATE])
