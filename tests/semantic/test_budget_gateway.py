"""The error budget through the real gateway: labels from misses open the bar, a wrong audited
hit closes it and demotes the entry, and the counts are shared and kept through Redis."""

from __future__ import annotations

import json
import logging
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis as redis_lib
import yaml

from cache.semantic.budget_store import EPOCHS_PER_HALF_LIFE, field_name
from cache.settings import SemanticPolicy
from gateway.app import build_app
from gateway.config import Settings, load_settings
from tests.integration.cache.conftest import ADMIN_TOKEN
from tests.semantic.test_gateway import ask, client_for, semantic_config
from tests.support.servers import RedisServer, ServerThread

Q = "How do I reset my password?"
PARA = "How can I reset my password?"
# The live-label mechanics alone: no prior, and a 95 % bound so that a few labels decide.
BUDGET: dict[str, Any] = {
    "max_error_rate": 0.5,
    "min_labels": 3,
    "audit_rate": 0.1,
    "error_confidence": 0.95,
    "prior": False,
}


@pytest.fixture
def answers() -> dict[str, str]:
    return {
        Q: "Open Settings, then Security, then Reset.",
        PARA: "Open Settings, then Security, then Reset.",
    }


def admin_state(url: str, route: str = "chat") -> dict[str, Any]:
    req = urllib.request.Request(
        f"{url}/admin/semantic", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    with urllib.request.urlopen(req, timeout=5) as r:
        doc: dict[str, Any] = json.loads(r.read())
    state: dict[str, Any] = doc["routes"][route]
    return state


def wait_for(check: Callable[[], bool], what: str, deadline_s: float = 15.0) -> None:
    """Background labels land after the response: poll (a deadline, not a timing claim)."""
    end = time.monotonic() + deadline_s
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.05)


def teach(url: str, tenants: range) -> None:
    """Each tenant: the question (a miss), then its paraphrase (a miss with that candidate,
    which the fresh answer labels: the same answer, so 'agree')."""
    for t in tenants:
        c = client_for(url, f"sk-t{t}")
        assert ask(c, Q, temperature=0)[1]["x-cache"] == "miss"
        assert ask(c, PARA, temperature=0)[1]["x-cache"] == "miss"


def metric(url: str, line_start: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(line_start):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_labels_from_misses_open_the_bar_and_a_wrong_audit_closes_it(
    class_upstream: ServerThread,
    answers: dict[str, str],
    start_gateway: Callable[..., ServerThread],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="latentgate.semantic.budget")
    gw = start_gateway(semantic_config(class_upstream.url, **BUDGET))
    state = admin_state(gw.url)
    assert state["max_error_rate"] == 0.5 and not state["budget"]["bar"]["open"]
    teach(gw.url, range(3))
    wait_for(lambda: admin_state(gw.url)["budget"]["labels"] == 3, "three labels")
    state = admin_state(gw.url)["budget"]
    assert state["bar"]["open"] and state["wrong"] == 0
    assert metric(gw.url, 'latentgate_semantic_bar_open{route="chat"}') == 1
    assert metric(gw.url, 'latentgate_semantic_labels_total{outcome="agree",route="chat"') == 3

    # The upstream's answer to the paraphrase moves: an audit of a hit will disagree.
    answers[PARA] = "Contact support."
    for t in range(3, 13):
        c = client_for(gw.url, f"sk-t{t}")
        stored, _ = ask(c, Q, temperature=0)
        text, h = ask(c, PARA, temperature=0)
        if not admin_state(gw.url)["budget"]["bar"]["open"]:
            break
        assert h["x-cache"] == "semantic-hit" and text == stored
        assert float(h["x-cache-similarity"]) > 0.9 and "x-cache-score" in h
    wait_for(
        lambda: (
            metric(gw.url, 'latentgate_semantic_audits_total{outcome="disagree",route="chat"}') == 1
        ),
        "one audited hit that disagreed",
    )
    state = admin_state(gw.url)["budget"]
    assert state["audits"] == 1 and state["semantic_hits"] == 10  # 10 % of hits
    assert state["audits_by_outcome"] == {"agree": 0, "disagree": 1, "unusable": 0, "error": 0}
    assert state["labels_by_source"]["audit"] == {
        "agree": 0,
        "disagree": 1,
        "unusable": 0,
        "shed": 0,
    }
    assert state["labels_by_source"]["miss"]["agree"] >= 3
    assert not state["bar"]["open"]  # 1 wrong in 4: the bound is over the budget: closed
    assert metric(gw.url, 'latentgate_semantic_error_rate{route="chat",stat="bound"}') > 0.5
    # ... and says so, of the shipped point's region it would start from
    assert state["bar"]["closed_reason"] == "bound_over_budget" and "served_region" not in state
    assert state["shipped_region"]["labels"] == 4 and state["shipped_region"]["error_bound"] > 0.5
    reason = 'latentgate_semantic_bar_closed_reason{reason="bound_over_budget",route="chat"}'
    assert metric(gw.url, reason) == 1
    said = [r.getMessage() for r in caplog.records if r.name == "latentgate.semantic.budget"]
    assert any("serving cosine >= " in m for m in said), said
    assert "closed (bound_over_budget)" in said[-1], said
    # that tenant's paraphrase now goes upstream (and gets the upstream's new answer)
    text, h = ask(client_for(gw.url, "sk-t12"), PARA, temperature=0)
    assert h["x-cache"] == "miss" and text == "Contact support."


def test_without_the_keys_the_static_point_serves(
    class_upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(semantic_config(class_upstream.url))
    c = client_for(gw.url, "sk-other")
    assert ask(c, Q, temperature=0)[1]["x-cache"] == "miss"
    assert ask(c, PARA, temperature=0)[1]["x-cache"] == "semantic-hit"  # today's static point
    state = admin_state(gw.url)
    assert "budget" not in state and state["max_error_rate"] is None


@pytest.mark.parametrize("prior", [True, False])
def test_the_shipped_prior_serves_before_any_label_and_only_with_it(
    prior: bool, class_upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """Budget 0.5 and the development data's labels: the prior alone proves the shipped
    point's region (its error there is well under 50 % on every dataset); without the prior
    the route waits for its own labels."""
    cfg = semantic_config(class_upstream.url, max_error_rate=0.5, min_labels=50, prior=prior)
    gw = start_gateway(cfg)
    c = client_for(gw.url, "sk-prior")
    assert ask(c, Q, temperature=0)[1]["x-cache"] == "miss"
    h = ask(c, PARA, temperature=0)[1]
    state = admin_state(gw.url)["budget"]
    assert state["labels"] == (0 if prior else 1)  # a hit is no label; a miss is one
    if prior:
        assert h["x-cache"] == "semantic-hit" and state["bar"]["open"]
        assert set(state["prior"]) == {"qqp", "paws", "stsb"}
        assert state["bar"]["score"] >= admin_state(gw.url)["static_point"]["score"]
        # no wrong label yet: the prior is taken as it is, and /metrics says so
        assert state["prior_scale"] == 1.0
        assert metric(gw.url, 'latentgate_semantic_prior_scale{route="chat"}') == 1.0
    else:
        assert h["x-cache"] == "miss" and not state["bar"]["open"]
        assert state["prior"] is None


@pytest.mark.slow  # three gateway starts, each loading the embedder
def test_counts_are_shared_between_gateways_and_survive_a_restart(
    class_upstream: ServerThread, redis_server: RedisServer
) -> None:
    cfg = semantic_config(class_upstream.url, redis_server.url, **BUDGET)
    cfg["cache"]["redis"]["key_prefix"] = f"bud{uuid.uuid4().hex[:8]}:"
    settings = Settings.model_validate(cfg)

    def gateway() -> ServerThread:
        return ServerThread(lambda: build_app(settings)).start()

    a, b = gateway(), gateway()
    try:
        teach(a.url, range(3))
        # b learns a's labels through Redis without seeing any of that traffic
        wait_for(lambda: admin_state(b.url)["budget"]["labels"] == 3, "b sees a's labels")
        assert admin_state(b.url)["budget"]["bar"]["open"]
    finally:
        a.stop()
        b.stop()
    c = gateway()  # a fresh process state: the counts come back from Redis
    try:
        wait_for(lambda: admin_state(c.url)["budget"]["labels"] == 3, "c reads the kept labels")
        assert admin_state(c.url)["budget"]["bar"]["open"]
    finally:
        c.stop()
    # Labels mean what the scorer and the rules made them: with the rival rule off they were
    # gathered on another population, so a route configured so starts afresh.
    other = semantic_config(class_upstream.url, redis_server.url, **BUDGET, rival_cosine=None)
    other["cache"]["redis"]["key_prefix"] = cfg["cache"]["redis"]["key_prefix"]
    d = ServerThread(lambda: build_app(Settings.model_validate(other))).start()
    try:
        state = admin_state(d.url)
        assert state["label_context"] != admin_state_context(settings)
        time.sleep(1.5)  # three flushes: nothing comes back from the other context's hash
        assert admin_state(d.url)["budget"]["labels"] == 0
    finally:
        d.stop()


def test_shared_labels_fade_by_age_and_old_epochs_leave_redis(
    class_upstream: ServerThread, redis_server: RedisServer
) -> None:
    """Counts a fleet wrote long ago: one half-life old they weigh half; past four half-lives
    they are deleted from the hash."""
    cfg = semantic_config(class_upstream.url, redis_server.url, **BUDGET)
    prefix = f"fade{uuid.uuid4().hex[:8]}:"
    cfg["cache"]["redis"]["key_prefix"] = prefix
    settings = Settings.model_validate(cfg)
    half_life = SemanticPolicy().label_half_life  # the default
    length = int(half_life / EPOCHS_PER_HALF_LIFE)
    now = int(time.time() // length * length)  # the current epoch's start
    key = f"{prefix}sem:budget2:chat:{admin_state_context(settings)}"
    r = redis_lib.Redis.from_url(redis_server.url)
    one = int(now - half_life)  # one half-life old
    r.hset(key, field_name("l", one, length, 0.98, 0.6), 200)
    r.hset(key, field_name("w", one, length, 0.98, 0.6), 20)
    old = field_name("l", int(now - 5 * half_life), length, 0.98, 0.6)  # five half-lives old
    r.hset(key, old, 1000)
    gw = ServerThread(lambda: build_app(settings)).start()
    try:
        wait_for(lambda: admin_state(gw.url)["budget"]["labels"] == 100, "half the old labels")
        assert admin_state(gw.url)["budget"]["wrong"] == 10
        wait_for(lambda: not r.hexists(key, old), "the oldest epoch deleted")
    finally:
        r.close()
        gw.stop()


def admin_state_context(settings: Settings) -> str:
    """The label context a gateway with these settings gives its `chat` route (read from a
    running one: the same function the route's key is built with)."""
    gw = ServerThread(lambda: build_app(settings)).start()
    try:
        wait_for(lambda: "label_context" in admin_state(gw.url), "the route's budget")
        return str(admin_state(gw.url)["label_context"])
    finally:
        gw.stop()


def test_counts_are_shared_and_kept_with_the_index_sync_off(
    class_upstream: ServerThread, redis_server: RedisServer
) -> None:
    """`sync: false` turns off the shared index only: with Redis configured, the budget's
    counts are still shared and survive a restart."""
    cfg = semantic_config(class_upstream.url, redis_server.url, **BUDGET)
    cfg["cache"]["redis"]["key_prefix"] = f"nosync{uuid.uuid4().hex[:8]}:"
    cfg["cache"]["semantic"] = {"sync": False}
    settings = Settings.model_validate(cfg)
    a = ServerThread(lambda: build_app(settings)).start()
    try:
        teach(a.url, range(3))
        wait_for(lambda: admin_state(a.url)["budget"]["labels"] == 3, "three labels")
    finally:
        a.stop()
    b = ServerThread(lambda: build_app(settings)).start()
    try:
        wait_for(lambda: admin_state(b.url)["budget"]["labels"] == 3, "b reads the kept labels")
    finally:
        b.stop()


@pytest.mark.parametrize("turned_off", ["semantic", "exact"])
def test_a_reload_that_turns_the_semantic_cache_off_shows_the_bar_serving_nothing(
    class_upstream: ServerThread, tmp_path: Path, turned_off: str
) -> None:
    """/metrics and /admin/semantic said the bar was open after a reload had turned the
    route's semantic cache off (the stage keeps running until a restart); and after one that
    turned its exact cache off, which takes the semantic stage's flow with it."""
    cfg = semantic_config(class_upstream.url, max_error_rate=0.5, min_labels=50)
    path = tmp_path / "latentgate.yaml"
    path.write_text(yaml.safe_dump(cfg))
    gw = ServerThread(lambda: build_app(load_settings(str(path)), config_path=str(path))).start()
    try:
        wait_for(lambda: admin_state(gw.url).get("budget", {}).get("bar", {}).get("open"), "open")
        assert metric(gw.url, 'latentgate_semantic_bar_open{route="chat"}') == 1.0
        c = client_for(gw.url, "sk-reload")
        ask(c, Q, temperature=0)
        assert ask(c, PARA, temperature=0)[1]["x-cache"] == "semantic-hit"
        for r in cfg["routes"]:
            if r["name"] == "chat":
                r["cache"][turned_off]["enabled"] = False
        path.write_text(yaml.safe_dump(cfg))
        req = urllib.request.Request(
            f"{gw.url}/admin/reload",
            method="POST",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200
        state = admin_state(gw.url)
        assert state["serving"] is False and state["budget"]["bar"]["open"] is False
        assert metric(gw.url, 'latentgate_semantic_bar_open{route="chat"}') == 0.0
        assert ask(c, PARA, temperature=0)[1].get("x-cache") != "semantic-hit"
    finally:
        gw.stop()
