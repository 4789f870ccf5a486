"""Gateway configs with the exact cache on, for the cache's integration tests."""

from __future__ import annotations

import copy
import uuid
from typing import Any

from tests.conftest import base_config

ADMIN_TOKEN = "admin-secret"


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
