"""Gateway configs with the exact cache on, for the cache's integration tests."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import base_config
from tests.support.servers import GatewayProcess

ADMIN_TOKEN = "admin-secret"
ROOT = Path(__file__).resolve().parents[3]


def cache_config(
    upstream_url: str,
    redis_url: str | None = None,
    *,
    tiers: list[str] | None = None,
    routes: tuple[str, ...] = ("chat", "completions", "embeddings", "v2", "default"),
    **exact: Any,
) -> dict[str, Any]:
    """base_config with the exact cache on for the named routes (memory, plus Redis if given)."""
    cfg = copy.deepcopy(base_config(upstream_url))
    policy = {"enabled": True, "ttl": 60, "tiers": tiers or ["memory", "redis"], **exact}
    for r in cfg["routes"]:
        if r["name"] in routes:
            r["cache"] = {"exact": policy}
    cfg["admin"] = {"token": ADMIN_TOKEN}
    if redis_url is not None:
        cfg["cache"] = {
            "redis": {"url": redis_url, "key_prefix": f"it{uuid.uuid4().hex[:8]}:"},
            # sidecars sharing a Redis share entries only under one tenant secret
            "tenant_secret": "integration-tests-shared-secret",
        }
    return cfg


def anthropic_route(semantic: bool = False) -> dict[str, Any]:
    """The default config's Messages route, in memory; exact cache only unless asked (the
    semantic stage needs the embedder: tests/semantic/test_gateway_anthropic.py)."""
    cfg = yaml.safe_load((ROOT / "config" / "latentgate.yaml").read_text())
    route = next(r for r in cfg["routes"] if r["protocol"] == "anthropic")
    route = copy.deepcopy(route)
    if not semantic:
        route["cache"].pop("semantic")
    route["cache"]["exact"]["tiers"] = ["memory"]
    return dict(route)


@pytest.fixture
def processes() -> Iterator[Callable[..., GatewayProcess]]:
    started: list[GatewayProcess] = []

    def start(config: dict[str, Any], workers: int = 1) -> GatewayProcess:
        started.append(GatewayProcess(config, workers=workers))
        return started[-1].start()

    yield start
    for p in started:
        p.stop()
