"""What a reload does to stored answers: after it, a client is served only what the new config
would have produced and shared with it, including the answer of a call that was still arriving
when the reload came."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any

from gateway.state import STATE
from tests.conftest import base_config
from tests.ops.conftest import ADMIN_TOKEN, http
from tests.ops.reload_support import CHAT, InProcess, chat_cache, two_backend_config
from tests.support.servers import ServerThread


def _chat(url: str, body: dict[str, Any]) -> tuple[str, str]:
    status, hdrs, raw = http(
        "POST",
        url + "/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    assert status == 200, raw
    return hdrs.get("X-Cache", "none"), hdrs.get("X-Upstream", "")


def _cached(cfg: dict[str, Any], **exact: Any) -> dict[str, Any]:
    chat_cache(cfg, {"exact": {"enabled": True, "tiers": ["memory"], **exact}})
    return cfg


def test_a_call_whose_body_arrives_after_a_reload_is_stored_under_its_own_routes_key(
    upstream: ServerThread, in_process: Callable[..., InProcess]
) -> None:
    """The call's route (its adapter, its backend) is the generation it started on; its key
    was the new generation's route cache: what the old route left out of the key (top_p,
    ignored) was stored under the new key of a request without it."""
    cfg = _cached(
        base_config(upstream.url, admin={"token": ADMIN_TOKEN}), key={"ignore_fields": ["top_p"]}
    )
    gw = in_process(cfg)
    assert gw.server.app is not None
    pipeline = gw.server.app[STATE].pipeline
    body = json.dumps({**CHAT, "top_p": 0.1}).encode()
    host, port = gw.server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body[:10]
        )
        deadline = time.monotonic() + 10
        while pipeline.runtime.in_flight == 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # until the call has begun on generation 0
        assert pipeline.runtime.in_flight == 1
        gw.write(_cached(cfg))  # top_p is keyed from now on
        assert gw.reload()[0] == 200
        sock.sendall(body[10:])
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200") and b"X-Cache: miss" in answer
    # no client of the new policy is served the answer to top_p 0.1 for a request without it
    assert _chat(gw.server.url, CHAT)[0] == "miss"


def test_a_route_sent_to_another_backend_is_not_served_the_old_backends_answers(
    upstream: ServerThread, second_upstream: ServerThread, in_process: Callable[..., InProcess]
) -> None:
    """The key held the route, model and tenant, not where the answer came from: pointed at
    another backend (another model behind it), the route answered from the first one's
    entries, for their TTL."""
    gw = in_process(_cached(two_backend_config(upstream.url, second_upstream.url, "upstream")))
    assert _chat(gw.server.url, CHAT) == ("miss", "up")
    assert _chat(gw.server.url, CHAT) == ("hit", "up")
    gw.write(_cached(two_backend_config(upstream.url, second_upstream.url, "second")))
    assert gw.reload()[0] == 200
    assert _chat(gw.server.url, CHAT) == ("miss", "second")
    assert _chat(gw.server.url, CHAT) == ("hit", "second")
    # and back: the first backend's entries are its own again
    gw.write(_cached(two_backend_config(upstream.url, second_upstream.url, "upstream")))
    assert gw.reload()[0] == 200
    assert _chat(gw.server.url, CHAT) == ("hit", "up")


def test_a_shortened_ttl_applies_to_answers_stored_before_it(
    upstream: ServerThread, in_process: Callable[..., InProcess]
) -> None:
    """An entry lived the TTL it was stored with: an hour after the reload to 50 ms, it was
    still served."""
    cfg = _cached(base_config(upstream.url, admin={"token": ADMIN_TOKEN}), ttl=3600)
    gw = in_process(cfg)
    assert _chat(gw.server.url, CHAT)[0] == "miss"
    assert _chat(gw.server.url, CHAT)[0] == "hit"
    gw.write(_cached(cfg, ttl=0.05))
    assert gw.reload()[0] == 200
    time.sleep(0.1)  # the stored answer is now older than the new TTL
    assert _chat(gw.server.url, CHAT)[0] == "miss"


def test_what_a_routes_answers_come_from() -> None:
    """A local engine's model and input reading are part of it, a remote pool's replicas not
    (scaling a pool keeps its entries)."""
    from backends.settings import OnnxBackendSettings, RemoteBackendSettings
    from gateway.app import answers_from

    pool = RemoteBackendSettings(replicas=["http://a:1"])
    scaled = RemoteBackendSettings(replicas=["http://b:1", "http://c:1"])
    assert answers_from("p", pool) == answers_from("p", scaled)
    assert answers_from("p", pool) != answers_from("q", pool)
    engine = OnnxBackendSettings(model="builtin:all-MiniLM-L6-v2")

    def with_(**change: Any) -> str:
        return answers_from("e", engine.model_copy(update=change))

    assert answers_from("e", engine) == with_(warmup=False)
    assert answers_from("e", engine) != with_(model="/m.onnx")
    assert answers_from("e", engine) != with_(precision="int8")
