"""Contested neighbourhoods (cache.semantic.rivals): a paraphrase is not served a stored answer
while another stored question is close to it too; in the stage, under a learned bar, for a
flight, and through the gateway."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from cache.embedder import Embedder
from cache.semantic.budget import Bar
from cache.semantic.pending import PendingFlights
from cache.semantic.records import Search
from cache.semantic.rivals import RIVAL_COSINE, contested
from cache.semantic.route import SemanticRoute
from cache.semantic.stage import SemanticStage
from cache.semantic.verifier import MlpVerifier
from tests.semantic.test_budget_gateway import admin_state, wait_for
from tests.semantic.test_gateway import ask, client_for, semantic_config
from tests.semantic.test_semantic_single_flight import (  # noqa: F401 (a fixture)
    slow_upstream,
    upstream_calls,
)
from tests.support.servers import ServerThread

Q = "How do I reset my password?"
PARA = "How can I reset my password?"
RIVAL = "How do I reset my login password?"  # cosine 0.91 to PARA, 0.92 to Q: a miss after Q
FAR = "How do I reset my router?"  # cosine ~0.52 to PARA
SERVE_ALL = Bar(0.0, 0.0, True, 0.0, 0.0, 100)


def contested_lookups(stage: SemanticStage) -> float:
    return stage.metrics.lookups.labels("contested")._value.get()


def test_the_rule_counts_other_candidates_only() -> None:
    cos = np.asarray([0.99, 0.86, 0.5], np.float32)
    assert contested(cos, 0, 0.85) and contested(cos, 1, 0.85)
    assert not contested(cos, 0, 0.90)  # the pick itself is no rival
    assert not contested(cos, 0, None)  # the rule off
    assert contested(np.asarray([0.99], np.float32), 0, 0.85, outside=1)


async def test_a_second_close_question_contests_the_pick(
    stage: SemanticStage, verifier: MlpVerifier
) -> None:
    await stage.add("ns", Q, "k-q", ttl=60)
    await stage.add("ns", FAR, "k-far", ttl=60)
    hit = await stage.lookup("ns", PARA, verifier, rival=RIVAL_COSINE)
    assert hit is not None and hit.exact_key == "k-q"  # a distant neighbour is no rival
    await stage.add("ns", RIVAL, "k-rival", ttl=60)
    assert await stage.lookup("ns", PARA, verifier, rival=RIVAL_COSINE) is None
    assert contested_lookups(stage) == 1
    found = await stage.find("ns", PARA, verifier, rival=RIVAL_COSINE)
    assert found.hit is None and found.rivals == 2
    # Without the rule the verifier's pick is served as before.
    hit = await stage.lookup("ns", PARA, verifier, rival=None)
    assert hit is not None and hit.exact_key == "k-q"
    # Rivals are counted per namespace: another tenant's close question contests nothing.
    await stage.add("other", Q, "k-q2", ttl=60)
    assert await stage.lookup("other", PARA, verifier, rival=RIVAL_COSINE) is not None


async def test_a_learned_bar_neither_serves_nor_labels_a_contested_candidate(
    stage: SemanticStage, verifier: MlpVerifier
) -> None:
    seen: list[tuple[float, float]] = []

    async def search() -> Search:
        seen.clear()
        return await stage.search(
            "ns",
            PARA,
            verifier,
            SERVE_ALL,
            observe=lambda c, s: seen.append((c, s)),
            rival=RIVAL_COSINE,
        )

    await stage.add("ns", Q, "k-q", ttl=60)
    res = await search()
    assert res.hit is not None and seen
    await stage.add("ns", RIVAL, "k-rival", ttl=60)
    res = await search()
    # Not served, not handed on for a label, not counted as traffic the bar could serve.
    assert res.hit is None and res.candidate is None and res.rivals == 2 and not seen
    assert contested_lookups(stage) == 1


async def test_a_flight_is_contested_by_stored_questions_and_other_flights(
    embedder: Embedder, verifier: MlpVerifier
) -> None:
    flights = PendingFlights()
    flights.begin("ns", Q, await embedder.embed(Q))
    vec = await embedder.embed(PARA)
    assert await flights.find("ns", PARA, vec, verifier, rival=RIVAL_COSINE) is not None
    # One stored question close to the asked one (found by the lookup that missed) contests it.
    assert await flights.find("ns", PARA, vec, verifier, None, RIVAL_COSINE, 1) is None
    assert await flights.find("ns", PARA, vec, verifier, SERVE_ALL, RIVAL_COSINE, 1) is None
    # So does a second close question in flight.
    flights.begin("ns", RIVAL, await embedder.embed(RIVAL))
    assert await flights.find("ns", PARA, vec, verifier, rival=RIVAL_COSINE) is None
    assert await flights.find("ns", PARA, vec, verifier, rival=None) is not None


def contested_metric(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        lines = r.read().decode().splitlines()
    prefix = 'latentgate_semantic_lookups_total{result="contested"} '
    found = [ln for ln in lines if ln.startswith(prefix)]
    return float(found[0].split()[-1]) if found else 0.0


def test_through_the_gateway_a_contested_paraphrase_goes_upstream(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(semantic_config(upstream.url))
    c = client_for(gw.url)
    first, _ = ask(c, Q, temperature=0)
    assert ask(c, PARA, temperature=0)[1]["x-cache"] == "semantic-hit"  # Q stands alone
    assert ask(c, RIVAL, temperature=0)[1]["x-cache"] == "miss"  # stored: now a rival
    other = "How could I reset my password?"  # cosine 0.98 to Q, 0.90 to RIVAL
    answer, h = ask(c, other, temperature=0)
    assert h["x-cache"] == "miss" and answer != first  # the upstream's own answer
    assert contested_metric(gw.url) >= 1
    # `rival_cosine: null` restores the verifier's pick whatever its neighbours.
    gw2 = start_gateway(semantic_config(upstream.url, rival_cosine=None))
    c2 = client_for(gw2.url)
    first2, _ = ask(c2, Q, temperature=0)
    assert ask(c2, RIVAL, temperature=0)[1]["x-cache"] == "miss"
    again, h2 = ask(c2, other, temperature=0)
    assert h2["x-cache"] == "semantic-hit" and again == first2


async def test_a_rival_whose_answer_is_gone_contests_nothing(
    stage: SemanticStage, verifier: MlpVerifier
) -> None:
    """An evicted answer's vector must not keep its neighbourhood shut until its TTL."""
    await stage.add("ns", Q, "k-q", ttl=60)
    await stage.add("ns", RIVAL, "k-rival", ttl=60)

    asked: list[str] = []

    async def exists(key: str) -> bool:
        asked.append(key)
        return key != "k-rival"

    hit = await stage.lookup("ns", PARA, verifier, exists, rival=RIVAL_COSINE)
    assert hit is not None and hit.exact_key == "k-q"
    assert sorted(asked) == ["k-q", "k-rival"]  # each payload asked for once (a store read)
    assert "k-rival" not in {e.exact_key for e in stage.entries.values()}
    # and under a learned bar too
    await stage.add("ns", RIVAL, "k-rival", ttl=60)
    res = await stage.search("ns", PARA, verifier, SERVE_ALL, exists, rival=RIVAL_COSINE)
    assert res.hit is not None and res.hit.exact_key == "k-q" and res.rivals == 1


@pytest.mark.parametrize("budget", [False, True])
def test_a_lookup_that_failed_joins_no_flight(
    slow_upstream: ServerThread,  # noqa: F811 (the fixture imported above)
    start_gateway: Callable[..., ServerThread],
    monkeypatch: pytest.MonkeyPatch,
    budget: bool,
) -> None:
    """Without the lookup's rival count the join cannot tell a contested flight: it goes
    upstream rather than wait for an answer the lookup might have refused."""
    extra = {"max_error_rate": 0.5} if budget else {}
    gw = start_gateway(semantic_config(slow_upstream.url, **extra))
    assert ask(client_for(gw.url), RIVAL, temperature=0)[1]["x-cache"] == "miss"
    got: dict[str, Any] = {}
    leader = threading.Thread(
        target=lambda: got.update(first=ask(client_for(gw.url), Q, temperature=0))
    )
    leader.start()
    wait_for(lambda: admin_state(gw.url)["pending_flights"] == 1, "the leader in flight")

    async def failing(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the verifier failed")

    monkeypatch.setattr(SemanticRoute, "search", failing)
    _, h = ask(client_for(gw.url), PARA, temperature=0)
    leader.join()
    assert h["x-cache"] == "miss"  # not the leader's answer as a semantic hit
    assert upstream_calls(slow_upstream) == 3


def test_another_tenants_stored_question_neither_contests_nor_answers(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """Rivals are counted in the asker's own namespace (route, model, context, tenant)."""
    gw = start_gateway(semantic_config(upstream.url))
    alice, bob = client_for(gw.url, "sk-alice"), client_for(gw.url, "sk-bob")
    first, _ = ask(alice, Q, temperature=0)
    assert ask(bob, RIVAL, temperature=0)[1]["x-cache"] == "miss"  # stored for bob only
    answer, h = ask(alice, PARA, temperature=0)  # bob's close question is no rival of alice's
    assert h["x-cache"] == "semantic-hit" and answer == first
    answer, h = ask(bob, "How could I reset my password?", temperature=0)
    assert h["x-cache"] == "miss" and answer != first  # never alice's answer
    assert contested_metric(gw.url) == 0
