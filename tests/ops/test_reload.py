"""Hot reload: SIGHUP on a real process and POST /admin/reload in-process swap routes and
backends; a request in flight finishes on the old generation; an invalid file is rejected and
the old one keeps serving."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.app import build_app
from gateway.config import load_settings
from gateway.state import STATE
from tests.conftest import base_config
from tests.ops.conftest import ADMIN_TOKEN, http, http_json
from tests.support.servers import ROOT, GatewayProcess, ServerThread, wait_port
from tests.support.upstream import build_upstream

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
CHAT = {
    "model": "m",
    "messages": [{"role": "user", "content": "which upstream?"}],
    "temperature": 0,
}


@pytest.fixture
def second_upstream() -> Iterator[ServerThread]:
    server = ServerThread(lambda: build_upstream("second")).start()
    yield server
    server.stop()


def _two_backend_config(first: str, second: str, chat_backend: str) -> dict[str, Any]:
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


def _chat_upstream(url: str, headers: dict[str, str] | None = None) -> str:
    status, hdrs, _ = http(
        "POST",
        url + "/v1/chat/completions",
        json.dumps(CHAT).encode(),
        {"Content-Type": "application/json", **(headers or {})},
        timeout=20,
    )
    assert status == 200
    return hdrs["X-Upstream"]


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


@pytest.fixture
def in_process() -> Iterator[Callable[[dict[str, Any]], InProcess]]:
    made: list[InProcess] = []

    def make(config: dict[str, Any]) -> InProcess:
        gw = InProcess(config)
        made.append(gw)
        return gw

    yield make
    for gw in made:
        gw.server.stop()
        Path(gw.path).unlink(missing_ok=True)


def test_admin_reload_swaps_the_routes_backend(
    upstream: ServerThread,
    second_upstream: ServerThread,
    in_process: Callable[..., InProcess],
) -> None:
    gw = in_process(_two_backend_config(upstream.url, second_upstream.url, "upstream"))
    assert _chat_upstream(gw.server.url) == "up"
    gw.write(_two_backend_config(upstream.url, second_upstream.url, "second"))
    status, body = gw.reload()
    assert status == 200, body
    assert body["ok"] and body["generation"] == 1
    assert body["backends_kept"] == ["second", "upstream"]  # unchanged pools stay warm
    assert _chat_upstream(gw.server.url) == "second"
    # A changed backend is rebuilt, and its requests go to the new replica.
    cfg = _two_backend_config(upstream.url, second_upstream.url, "second")
    cfg["backends"]["second"]["replicas"] = [upstream.url]
    gw.write(cfg)
    status, body = gw.reload()
    assert status == 200 and body["backends_replaced"] == ["second"]
    assert _chat_upstream(gw.server.url) == "up"
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
    gw = in_process(_two_backend_config(upstream.url, second_upstream.url, "upstream"))
    bad = _two_backend_config(upstream.url, second_upstream.url, "missing-backend")
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
    assert _chat_upstream(gw.server.url) == "up"
    metrics = http("GET", gw.server.url + "/metrics")[2].decode()
    assert 'latentgate_config_reloads_total{result="invalid"} 2.0' in metrics


def test_in_flight_request_completes_across_a_reload(
    upstream: ServerThread,
    second_upstream: ServerThread,
    in_process: Callable[..., InProcess],
) -> None:
    gw = in_process(_two_backend_config(upstream.url, second_upstream.url, "upstream"))
    seen: dict[str, str] = {}

    def slow() -> None:
        seen["upstream"] = _chat_upstream(gw.server.url, {"X-Test-Delay": "1.5"})

    assert gw.server.app is not None
    old_pool = gw.server.app[STATE].backends["upstream"]

    def old_pool_closed() -> bool:
        return all(tr.closed for tr in old_pool.transports)  # type: ignore[attr-defined]

    t = threading.Thread(target=slow)
    t.start()
    time.sleep(0.5)  # the slow request is now waiting on the old generation's upstream
    cfg = _two_backend_config(upstream.url, second_upstream.url, "second")
    cfg["backends"]["upstream"]["replicas"] = [second_upstream.url]  # old pool gets replaced
    gw.write(cfg)
    status, body = gw.reload()
    assert status == 200 and "upstream" in body["backends_replaced"]
    assert _chat_upstream(gw.server.url) == "second"  # new requests: new generation at once
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
    gw = gateway_process(_two_backend_config(upstream.url, second_upstream.url, "upstream"))
    assert _chat_upstream(gw.url) == "up"
    cfg = yaml.safe_load(Path(gw.config_path).read_text())
    for route in cfg["routes"]:
        if route["name"] == "chat":
            route["backend"] = "second"
    Path(gw.config_path).write_text(yaml.safe_dump(cfg))
    assert gw.proc is not None
    gw.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _chat_upstream(gw.url) != "second":
        time.sleep(0.1)
    assert _chat_upstream(gw.url) == "second"
    # A broken file on SIGHUP: logged, old config still serving, process still up.
    Path(gw.config_path).write_text("backends: {}\nroutes: []\n")
    gw.proc.send_signal(signal.SIGHUP)
    time.sleep(1.0)
    assert gw.proc.poll() is None
    assert _chat_upstream(gw.url) == "second"
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


def _two_workers_with_chat_moved_to_second(
    upstream: ServerThread,
    second_upstream: ServerThread,
    gateway_process: Callable[..., GatewayProcess],
) -> GatewayProcess:
    """Two workers serving chat from `upstream`, their config file already pointing it at
    `second` (what a reload will pick up)."""
    gw = gateway_process(
        _two_backend_config(upstream.url, second_upstream.url, "upstream"), workers=2
    )
    cfg = yaml.safe_load(Path(gw.config_path).read_text())
    for route in cfg["routes"]:
        if route["name"] == "chat":
            route["backend"] = "second"
    Path(gw.config_path).write_text(yaml.safe_dump(cfg))
    return gw


def _wait_until_every_worker_answers_from_second(gw: GatewayProcess) -> None:
    """Workers reload in the background (a busy machine is slow): wait for it, then new
    connections, spread over both workers (SO_REUSEPORT), all get the new route's answer."""

    def answers() -> set[str]:
        return {_chat_upstream(gw.url, {"Connection": "close"}) for _ in range(30)}

    deadline = time.monotonic() + 20
    while answers() != {"second"} and time.monotonic() < deadline:
        time.sleep(0.2)
    assert answers() == {"second"}


def test_sighup_reaches_every_worker(
    upstream: ServerThread,
    second_upstream: ServerThread,
    gateway_process: Callable[..., GatewayProcess],
) -> None:
    gw = _two_workers_with_chat_moved_to_second(upstream, second_upstream, gateway_process)
    assert gw.proc is not None
    gw.proc.send_signal(signal.SIGHUP)  # to the parent, which forwards it
    _wait_until_every_worker_answers_from_second(gw)
    assert gw.stop() == 0


def test_a_sighup_while_the_workers_start_is_a_reload_not_their_end(
    upstream: ServerThread, second_upstream: ServerThread
) -> None:
    """`systemctl reload` right after a start: a SIGHUP that reaches the workers before their
    handlers are in used to end them (its default action); it is remembered and becomes the
    reload it asked for once they are."""
    cfg = _two_backend_config(upstream.url, second_upstream.url, "upstream")
    gw = GatewayProcess(cfg, workers=2)
    moved = yaml.safe_load(Path(gw.config_path).read_text())
    for route in moved["routes"]:
        if route["name"] == "chat":
            route["backend"] = "second"
    Path(gw.config_path).write_text(yaml.safe_dump(moved))
    gw._log = open(gw.log_path, "wb")  # noqa: SIM115 - closed by stop()
    gw.proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--config", gw.config_path, "--workers", "2"],
        cwd=ROOT,
        env=gw.env,
        stdout=gw._log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while "started 2 workers" not in gw.log() and time.monotonic() < deadline:
            time.sleep(0.01)
        gw.proc.send_signal(signal.SIGHUP)  # the workers are still building their apps
        wait_port("127.0.0.1", gw.port, 60)
        _wait_until_every_worker_answers_from_second(gw)
        assert "killed by signal" not in gw.log(), gw.log()
    finally:
        assert gw.stop() == 0, gw.log()


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
    _chat_cache(cfg, {"exact": {"enabled": True, "tiers": ["memory"]}})
    gw.write(cfg)
    assert gw.reload()[0] == 200
    assert [x_cache(), x_cache()] == ["miss", "hit"]
    _chat_cache(cfg, {})
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


def test_an_admin_reload_reaches_every_worker(
    upstream: ServerThread,
    second_upstream: ServerThread,
    gateway_process: Callable[..., GatewayProcess],
) -> None:
    """POST /admin/reload lands in one worker; the others reload too (through the parent)."""
    gw = _two_workers_with_chat_moved_to_second(upstream, second_upstream, gateway_process)
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    assert http("POST", gw.url + "/admin/reload", headers=auth)[0] == 200
    _wait_until_every_worker_answers_from_second(gw)
    # the SIGHUP the parent sends every worker comes back to the one that took the call: that
    # worker skips it (the file is the one it loaded), so each worker reloaded once
    for _ in range(200):
        if "already serves this file" in gw.log():
            break
        time.sleep(0.05)
    assert "already serves this file" in gw.log()
    metrics = http("GET", gw.url + "/metrics")[2].decode()
    generations = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("latentgate_config_generation{")
    ]
    assert generations == [1.0, 1.0], generations
    assert gw.stop() == 0


def test_a_purge_reaches_every_workers_memory(
    upstream: ServerThread, gateway_process: Callable[..., GatewayProcess]
) -> None:
    """`--workers 2`, memory only: a purge of one tenant, taken by one worker, has dropped that
    tenant's entry from the other worker's memory too by the time it answers, and no other
    tenant's. Before, the other worker dropped its whole memory tier (by SIGUSR1 through the
    parent) some time after the purge had answered."""
    cfg = base_config(upstream.url, admin={"token": ADMIN_TOKEN})
    _chat_cache(cfg, {"exact": {"enabled": True, "tiers": ["memory"]}})
    gw = gateway_process(cfg, workers=2)

    def upstream_calls() -> int:
        status, doc = http_json("GET", upstream.url + "/_test/stats")
        assert status == 200
        return int(doc["requests"].get("/v1/chat/completions", 0))

    def ask_many(who: str) -> set[str]:
        # a new connection each: SO_REUSEPORT spreads them over both workers
        return {
            http(
                "POST",
                gw.url + "/v1/chat/completions",
                json.dumps(CHAT).encode(),
                {
                    "Content-Type": "application/json",
                    "Connection": "close",
                    "Authorization": f"Bearer sk-{who}",
                },
            )[1].get("X-Cache", "")
            for _ in range(24)
        }

    ask_many("alice")
    ask_many("bob")
    assert upstream_calls() == 4  # one miss per tenant in each worker's memory
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    status, doc = http_json(
        "POST", gw.url + "/admin/cache/purge", {"tenant": "Bearer sk-alice"}, auth
    )
    assert status == 200, doc
    assert doc["purged"]["memory"] == 1
    assert list(doc["purged"]["other_workers"].values()) == [1], doc  # alice's copy, not bob's
    assert ask_many("bob") == {"hit"}  # bob's entries stayed in both workers
    assert upstream_calls() == 4
    ask_many("alice")
    assert upstream_calls() == 6  # both workers missed alice again: nothing stale survived
    assert gw.stop() == 0


def _chat_cache(cfg: dict[str, Any], policy: dict[str, Any]) -> None:
    """Give the config's `chat` route this cache policy."""
    for route in cfg["routes"]:
        if route["name"] == "chat":
            route["cache"] = policy


def test_a_route_that_cannot_have_a_semantic_stage_is_no_restart_to_report() -> None:
    """semantic on but the exact cache off: the stage skips the route at start-up (it needs
    the exact cache), so an unchanged reload has nothing to restart and shows the file as is."""
    from gateway.config import Settings
    from gateway.reload import semantic_kept

    cfg = base_config("http://127.0.0.1:9")
    _chat_cache(cfg, {"exact": {"enabled": False}, "semantic": {"enabled": True}})
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
