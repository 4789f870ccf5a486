"""/readyz and /v2/health/ready: the gateway's own readiness, with every part's real state.

Ready means: not draining, local engines and the semantic stage loaded, and the backends named
in `readiness.require` reachable. Remote pools and Redis are reported, never required unless named:
a sidecar whose upstream is down is still able to answer its cache and its local models.
"""

from __future__ import annotations

from typing import Any

from gateway.redact import redact
from gateway.state import AppState


async def _redis(state: AppState) -> dict[str, object] | None:
    tier = state.cache.redis if state.cache is not None else None
    if tier is None:
        return None
    return {"url": redact(tier.settings.url or ""), **(await tier.health())}


async def readiness(state: AppState) -> tuple[bool, dict[str, Any]]:
    """(ready, the /readyz body)."""
    required = set(state.settings.readiness.require)
    backends: dict[str, dict[str, object]] = {}
    ready = not state.draining
    for name, b in state.backends.items():
        info = b.describe()
        local = info.get("kind") != "remote"
        up = b.ready()
        backends[name] = {"ready": up, "required": local or name in required, **info}
        if (local or name in required) and not up:
            ready = False
    body: dict[str, Any] = {"ready": False, "draining": state.draining, "backends": backends}
    if state.semantic is not None:
        body["semantic"] = state.semantic.describe()
        ready = ready and state.semantic.ready
    if (redis := await _redis(state)) is not None:
        body["redis"] = redis
    body["ready"] = ready
    return ready, body
