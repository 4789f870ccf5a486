"""Hot reload: SIGHUP on a real process and POST /admin/reload in-process swap routes and
backends; a request in flight finishes on the old generation; an invalid file is rejected and
the old one keeps serving."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from gateway.state import STATE
from tests.conftest import base_config
from tests.ops.conftest import ADMIN_TOKEN, http, http_json
from tests.ops.reload_support import (
    CHAT,
    InProcess,
    chat_cache,
    chat_upstream,
    two_backend_config,
)
from tests.support.servers import GatewayProcess, ServerThread


def test_admin_reload_swaps_the_routes_backend(
    upstream: ServerThread,
    second_upstream: ServerThread,
    in_process: Callable[..., InProcess],
) -> None:
    gw = in_process(two_backend_config(upstream.url, second_upstream.url, "upstream"))
    assert chat_upstream(gw.server.url) == "up"
    gw.write(two_backend_config(upstream.url, second_upstream.url, "second"))
    status, body = gw.reload()
    assert status == 200, body
    assert body["ok"] and body["generation"] == 1
    assert body["backends_kept"] == ["second", "upstream"]  # unchanged pools stay warm
    assert chat_upstream(gw.server.url) == "second"
    # A changed backend is rebuilt, and its requests go to the new replica.
    cfg = two_backend_config(upstream.url, second_upstream.url, "second")
    cfg["backends"]["second"]["replicas"] = [upstream.url]
    gw.write(cfg)
    status, body = gw.reload()
    assert status == 200 and body["backends_replaced"] == ["second"]
    assert chat_upstream(gw.server.url) == "up"
    # once the old pool retires, the replica it dropped no longer shows as a healthy replica
    gone = (
        f'latentgate_upstream_replica_healthy{{backend="second",replica="{second_upstream.url}"}}'
    )
    now = f'latentgate_upstream_replica_healthy{{backend="second",replica="{upstream.url}"}}'
    for _ in range(100):
        metrics = http("GET", gw.server.url + "/metrics")[2].decode()
        if gone not in metrics:
            break
        time.sleep(0.05)
    assert gone not in metrics and now in metrics


def test_admin_reload_needs_the_token(
    upstream: ServerThread, in_process: Callable[..., InProcess]
) -> None:
    gw = in_process(base_config(upstream.url, admin={"token": ADMIN_TOKEN}))
    status, body = gw.reload(token="wrong")
    assert status == 401 and body["error"]["type"] == "unauthorized"


def test_invalid_config_is_rejected_and_the_old_one_keeps_serving(
    upstream: ServerThread,
    second_upstream: ServerThread,
    in_process: Callable[..., InProcess],
) -> None:
    gw = in_process(two_backend_config(upstream.url, second_upstream.url, "upstream"))
    bad = two_backend_config(upstream.url, second_upstream.url, "missing-backend")
    bad["limits"] = {"max_body_bytes": -1}
    gw.write(bad)
    status, body = gw.reload()
    assert status == 422
    assert body["ok"] is False and body["generation"] == 0
    paths = {e["path"] for e in body["errors"]}
    assert "limits.max_body_bytes" in paths
    assert all(e["message"] for e in body["errors"])
    gw.write("routes: [unclosed\n")
    status, body = gw.reload()
    assert status == 422 and "YAML" in body["errors"][0]["message"]
    assert chat_upstream(gw.server.url) == "up"
    metrics = http("GET", gw.server.url + "/metrics")[2].decode()
    assert 'latentgate_config_reloads_total{result="invalid"} 2.0' in metrics


def test_in_flight_request_completes_across_a_reload(
    upstream: ServerThread,
    second_upstream: ServerThread,
    in_process: Callable[..., InProcess],
) -> None:
    gw = in_process(two_backend_config(upstream.url, second_upstream.url, "upstream"))
    seen: dict[str, str] = {}

    def slow() -> None:
        seen["upstream"] = chat_upstream(gw.server.url, {"X-Test-Delay": "1.5"})

    assert gw.server.app is not None
    old_pool = gw.server.app[STATE].backends["upstream"]

    def old_pool_closed() -> bool:
        return all(tr.closed for tr in old_pool.transports)  # type: ignore[attr-defined]

    t = threading.Thread(target=slow)
    t.start()
    time.sleep(0.5)  # the slow request is now waiting on the old generation's upstream
    cfg = two_backend_config(upstream.url, second_upstream.url, "second")
    cfg["backends"]["upstream"]["replicas"] = [second_upstream.url]  # old pool gets replaced
    gw.write(cfg)
    status, body = gw.reload()
    assert status == 200 and "upstream" in body["backends_replaced"]
    assert chat_upstream(gw.server.url) == "second"  # new requests: new generation at once
    assert not old_pool_closed()  # still serving the request that started on it
    t.join(20)
    assert seen.get("upstream") == "up"  # the old request finished on the old backend
    deadline = time.monotonic() + 5
    while not old_pool_closed() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert old_pool_closed()  # and was closed once drained


def test_sighup_reloads_a_running_process(
    upstream: ServerThread,
    second_upstream: ServerThread,
    gateway_process: Callable[..., GatewayProcess],
) -> None:
    gw = gateway_process(two_backend_config(upstream.url, second_upstream.url, "upstream"))
    assert chat_upstream(gw.url) == "up"
    cfg = yaml.safe_load(Path(gw.config_path).read_text())
    for route in cfg["routes"]:
        if route["name"] == "chat":
            route["backend"] = "second"
    Path(gw.config_path).write_text(yaml.safe_dump(cfg))
    assert gw.proc is not None
    gw.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and chat_upstream(gw.url) != "second":
        time.sleep(0.1)
    assert chat_upstream(gw.url) == "second"
    # A broken file on SIGHUP: logged, old config still serving, process still up.
    Path(gw.config_path).write_text("backends: {}\nroutes: []\n")
    gw.proc.send_signal(signal.SIGHUP)
    time.sleep(1.0)
    assert gw.proc.poll() is None
    assert chat_upstream(gw.url) == "second"
    assert "reload rejected" in gw.log()


def test_start_only_sections_are_reported_not_applied(
    upstream: ServerThread, in_process: Callable[..., InProcess]
) -> None:
    cfg = base_config(upstream.url, admin={"token": ADMIN_TOKEN})
    gw = in_process(cfg)
    changed = base_config(
        upstream.url, admin={"token": "rotated-token-123456"}, limits={"max_body_bytes": 1024}
    )
    gw.write(changed)
    status, body = gw.reload()
    assert status == 200 and body["restart_required"] == ["limits"]
    # The admin token is swapped (rotation without a restart); the limits are not.
    assert gw.reload(token=ADMIN_TOKEN)[0] == 401
    status, cfg_now = http_json(
        "GET",
        gw.server.url + "/admin/config",
        headers={"Authorization": "Bearer rotated-token-123456"},
    )
    assert status == 200 and cfg_now["limits"]["max_body_bytes"] == 16 << 20


def test_reload_swaps_a_routes_cache_policy(
    upstream: ServerThread, in_process: Callable[..., InProcess]
) -> None:
    cfg = base_config(upstream.url, admin={"token": ADMIN_TOKEN})
    gw = in_process(cfg)
    body = json.dumps(CHAT).encode()

    def x_cache() -> str:
        status, hdrs, _ = http(
            "POST",
            gw.server.url + "/v1/chat/completions",
            body,
            {"Content-Type": "application/json"},
        )
        assert status == 200
        return hdrs.get("X-Cache", "none")

    assert {x_cache(), x_cache()} == {"none"}  # no cache policy on the route yet
    chat_cache(cfg, {"exact": {"enabled": True, "tiers": ["memory"]}})
    gw.write(cfg)
    assert gw.reload()[0] == 200
    assert [x_cache(), x_cache()] == ["miss", "hit"]
    chat_cache(cfg, {})
    gw.write(cfg)
    assert gw.reload()[0] == 200
    assert x_cache() == "none"  # off again: the stored entry is no longer served


def test_a_reload_of_a_file_that_is_not_utf8_is_a_422_and_the_old_config_serves(
    upstream: ServerThread, in_process: Callable[..., InProcess]
) -> None:
    cfg = base_config(upstream.url, admin={"token": ADMIN_TOKEN})
    gw = in_process(cfg)
    Path(gw.path).write_bytes(yaml.safe_dump(cfg).encode() + b"# caf\xe9\n")
    status, body = gw.reload()
    assert status == 422, body
    assert "not UTF-8" in json.dumps(body)
    assert http("GET", gw.server.url + "/v1/models")[0] == 200


def test_a_route_that_cannot_have_a_semantic_stage_is_no_restart_to_report() -> None:
    """semantic on but the exact cache off: the stage skips the route at start-up (it needs
    the exact cache), so an unchanged reload has nothing to restart and shows the file as is."""
    from gateway.config import Settings
    from gateway.reload import semantic_kept

    cfg = base_config("http://127.0.0.1:9")
    chat_cache(cfg, {"exact": {"enabled": False}, "semantic": {"enabled": True}})
    settings = Settings.model_validate(cfg)
    kept, restart = semantic_kept(settings, None)
    assert restart == [] and kept is settings


def test_the_generated_tenant_secret_read_back_at_a_reload_is_no_restart(
    upstream: ServerThread,
    in_process: Callable[..., InProcess],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default config says `tenant_secret: ${LATENTGATE_TENANT_SECRET:-}`: empty at start,
    so the server generates one into the environment, and a reload reads that one back. The
    same secret: no restart to report (every unchanged reload of `make run` said "restart needed
    for cache"). Another secret is one."""
    generated = "ab" * 32
    monkeypatch.setenv("LATENTGATE_TENANT_SECRET", generated)
    cfg = base_config(upstream.url, admin={"token": ADMIN_TOKEN})
    gw = in_process(cfg)  # started without a configured secret
    cfg["cache"] = {**cfg.get("cache", {}), "tenant_secret": generated}
    gw.write(cfg)
    status, doc = gw.reload()
    assert status == 200 and doc["restart_required"] == [], doc
    cfg["cache"]["tenant_secret"] = "cd" * 32
    gw.write(cfg)
    status, doc = gw.reload()
    assert status == 200 and doc["restart_required"] == ["cache"], doc
