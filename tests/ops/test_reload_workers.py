"""Hot reload with `--workers 2`: SIGHUP and POST /admin/reload reach every worker, including
one still starting; a purge taken by one worker reaches the others' memory."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from tests.conftest import base_config
from tests.ops.conftest import ADMIN_TOKEN, http, http_json
from tests.ops.reload_support import CHAT, chat_cache, chat_upstream, two_backend_config
from tests.support.servers import ROOT, GatewayProcess, ServerThread, wait_port


def _two_workers_with_chat_moved_to_second(
    upstream: ServerThread,
    second_upstream: ServerThread,
    gateway_process: Callable[..., GatewayProcess],
) -> GatewayProcess:
    """Two workers serving chat from `upstream`, their config file already pointing it at
    `second` (what a reload will pick up)."""
    gw = gateway_process(
        two_backend_config(upstream.url, second_upstream.url, "upstream"), workers=2
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
        return {chat_upstream(gw.url, {"Connection": "close"}) for _ in range(30)}

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
    cfg = two_backend_config(upstream.url, second_upstream.url, "upstream")
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
    chat_cache(cfg, {"exact": {"enabled": True, "tiers": ["memory"]}})
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
