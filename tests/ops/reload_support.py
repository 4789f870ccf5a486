"""What the reload tests share: a gateway served in-process from a config file it reloads,
two-backend configs, the chat call that says which upstream answered."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import yaml

from gateway.app import build_app
from gateway.config import load_settings
from tests.conftest import base_config
from tests.ops.conftest import ADMIN_TOKEN, http, http_json
from tests.support.servers import ServerThread

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


class InProcess:
    """A gateway built from a config file on disk, served in-process."""

    def __init__(self, config: dict[str, Any]) -> None:
        _fd, self.path = tempfile.mkstemp(suffix=".yaml", prefix="lg-reload-")
        self.write(config)
        settings = load_settings(self.path)
        self.server = ServerThread(lambda: build_app(settings, config_path=self.path)).start()

    def write(self, config: dict[str, Any] | str) -> None:
        text = config if isinstance(config, str) else yaml.safe_dump(config)
        Path(self.path).write_text(text)

    def reload(self, token: str = ADMIN_TOKEN) -> tuple[int, Any]:
        return http_json(
            "POST", self.server.url + "/admin/reload", headers={"Authorization": f"Bearer {token}"}
        )
