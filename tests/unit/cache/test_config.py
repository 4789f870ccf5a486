"""Default config: exact cache on for OpenAI routes; Redis only when LATENTGATE_REDIS_URL is set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import cache
from gateway.app import build_app
from gateway.config import load_settings
from gateway.state import STATE

CONFIG = Path(__file__).resolve().parents[3] / "config" / "latentgate.yaml"


async def test_default_config_memory_only_without_redis_url() -> None:
    settings = load_settings(CONFIG, environ={})
    assert settings.cache.redis is not None and settings.cache.redis.url is None
    exact = {r.name: r.cache.exact.enabled for r in settings.routes}
    assert exact["openai-chat"] and exact["openai-completions"] and exact["openai-embeddings"]
    state = build_app(settings)[STATE]
    assert state.cache is not None and state.cache.redis is None
    assert set(state.cache.routes) == {
        "openai-chat",
        "openai-completions",
        "openai-embeddings",
        "local-embeddings",
        "local-v2",
        "anthropic-messages",
        "grpc-local-v2",
        "grpc-v2",
    }
    await close_backends(state)


async def test_redis_url_from_the_environment_enables_l2() -> None:
    settings = load_settings(CONFIG, environ={"LATENTGATE_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert settings.cache.redis is not None
    assert settings.cache.redis.url == "redis://127.0.0.1:1/0"
    state = build_app(settings)[STATE]
    assert state.cache is not None and state.cache.redis is not None
    await close_backends(state)


async def test_redis_mode_from_the_environment() -> None:
    settings = load_settings(CONFIG)
    assert settings.cache.redis is not None and settings.cache.redis.mode == "standalone"
    env = {
        "LATENTGATE_REDIS_URL": "redis://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3/0",
        "LATENTGATE_REDIS_MODE": "sentinel",
        "LATENTGATE_REDIS_SENTINEL_MASTER": "cache-primary",
    }
    redis = load_settings(CONFIG, environ=env).cache.redis
    assert redis is not None and (redis.mode, redis.sentinel_master) == (
        "sentinel",
        "cache-primary",
    )
    with pytest.raises(Exception, match="mode"):
        load_settings(CONFIG, environ={**env, "LATENTGATE_REDIS_MODE": "clustr"})


async def close_backends(state: Any) -> None:
    """The app was built, never run: its upstream pools' HTTP sessions still need closing."""
    for backend in state.backends.values():
        await backend.aclose()


def test_package_exports_what_it_names() -> None:
    for name in cache.__all__:
        assert hasattr(cache, name), name
