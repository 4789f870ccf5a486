"""What the reload tests share: two-backend configs, the chat call that says
which upstream answered."""

from __future__ import annotations

import json
from typing import Any

from tests.conftest import base_config
from tests.ops.conftest import ADMIN_TOKEN, http

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
CHAT = {
    "model": "m",
    "messages": [{"role": "user", "content": "which upstream?"}],
    "temperature": 0,
}


def two_backend_config(first: str, second: str, chat_backend: str) -> dict[str, Any]:
    cfg = base_config(first, admin={"token": ADMIN_TOKEN})
    cfg["backends"]["second"] = {
        "kind": "remote",
        "replicas": [second],
        "timeouts": {"connect": 1, "read": 10, "total": 20},
    }
    for route in cfg["routes"]:
        if route["name"] == "chat":
            route["backend"] = chat_backend
    return cfg


def chat_upstream(url: str, headers: dict[str, str] | None = None) -> str:
    status, hdrs, _ = http(
        "POST",
        url + "/v1/chat/completions",
        json.dumps(CHAT).encode(),
        {"Content-Type": "application/json", **(headers or {})},
        timeout=20,
    )
    assert status == 200
    return hdrs["X-Upstream"]


def chat_cache(cfg: dict[str, Any], policy: dict[str, Any]) -> None:
    """Give the config's `chat` route this cache policy."""
    for route in cfg["routes"]:
        if route["name"] == "chat":
            route["cache"] = policy
