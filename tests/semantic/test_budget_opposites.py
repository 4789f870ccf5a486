"""A learned bar never serves a question its minimal opposite's answer.

A bar with a cosine-only part serves any scored candidate at its cosine. The verifier leaves a
minimal opposite ("Is it safe ...?" / "Is it not safe ...?", cosine 0.99) unscored, so no bar
serves it, labels it or lets it join the other's flight (the static point never served it)."""

from __future__ import annotations

import time
import uuid

import pytest
import redis as redis_lib

from cache.embedder import Embedder
from cache.semantic.budget_store import field_name
from cache.semantic.verifier import MlpVerifier
from gateway.app import build_app
from gateway.config import Settings
from tests.semantic.test_budget_gateway import (
    admin_state,
    admin_state_context,
    wait_for,
)
from tests.semantic.test_gateway import ask, client_for, semantic_config
from tests.support.servers import RedisServer, ServerThread

SAFE = "Is it safe to eat raw chicken?"
NOT_SAFE = "Is it not safe to eat raw chicken?"


@pytest.fixture
def answers() -> dict[str, str]:
    return {SAFE: "No. Raw chicken often carries Salmonella.", NOT_SAFE: "Correct, it is not."}


def test_a_cosine_only_bar_does_not_serve_the_minimal_opposite(
    class_upstream: ServerThread, redis_server: RedisServer
) -> None:
    cfg = semantic_config(class_upstream.url, redis_server.url, max_error_rate=0.10, prior=False)
    prefix = f"opp{uuid.uuid4().hex[:8]}:"
    cfg["cache"]["redis"]["key_prefix"] = prefix
    settings = Settings.model_validate(cfg)
    key = f"{prefix}sem:budget2:chat:{admin_state_context(settings)}"
    now = int(time.time())
    r = redis_lib.Redis.from_url(redis_server.url)
    # A fleet's labels as on question-like traffic: the shipped point's region clean, and
    # near-verbatim repeats (cosine >= 0.98) clean whatever their verifier score.
    for (cos, score), n, wrong in (((0.95, 0.55), 300, 0), ((0.98, 0.10), 300, 3)):
        r.hset(key, field_name("l", now, 0, cos, score), n)
        r.hset(key, field_name("w", now, 0, cos, score), wrong)
        r.hset(key, field_name("v", now, 0, cos, score), n)
    gw = ServerThread(lambda: build_app(settings)).start()
    try:
        wait_for(lambda: admin_state(gw.url)["budget"]["bar"]["open"], "the bar opens")
        bar = admin_state(gw.url)["budget"]["bar"]
        assert bar["cosine_only"] <= 0.99  # the bar serves low scores at the pair's cosine
        c = client_for(gw.url, "sk-opp")
        _, h1 = ask(c, SAFE, temperature=0)
        assert h1["x-cache"] == "miss"
        text, h2 = ask(c, NOT_SAFE, temperature=0)
        assert h2["x-cache"] == "miss", "the opposite question was served the stored answer"
        assert text == "Correct, it is not."
    finally:
        r.close()
        gw.stop()


async def test_the_minimal_opposite_does_not_join_a_flight(
    embedder: Embedder, verifier: MlpVerifier
) -> None:
    """The same through semantic single flight, under a bar that serves any score over 0.95."""
    from cache.semantic.budget import Bar
    from cache.semantic.pending import PendingFlights
    from cache.semantic.setup import budget_scorer

    flights = PendingFlights()
    va, vb = embedder.embed_sync([SAFE, NOT_SAFE])
    flights.begin("ns", SAFE, va, "k")
    bar = Bar(0.94, 0.9, True, 0.0, 0.0, 300, cos_only=0.95)
    joined = await flights.find("ns", NOT_SAFE, vb, budget_scorer(verifier), bar, 0.88)
    assert joined is None
