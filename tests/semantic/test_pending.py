"""Semantic single flight: a paraphrase waits for the equivalent miss in flight."""

from __future__ import annotations

import asyncio

import numpy as np

from cache.codec import CacheEntry
from cache.embedder import Embedder
from cache.semantic.budget import Bar
from cache.semantic.pending import PendingFlights
from cache.semantic.verifier import MlpVerifier

Q = "How do I reset my password?"
PARA = "How can I reset my password?"
OTHER = "How do I delete my account?"


async def test_a_paraphrase_waits_for_the_answer_in_flight(
    embedder: Embedder, verifier: MlpVerifier
) -> None:
    flights = PendingFlights()
    leader = flights.begin("ns", Q, await embedder.embed(Q))
    joined = await flights.find("ns", PARA, await embedder.embed(PARA), verifier)
    assert joined is not None and joined.flight is leader and joined.similarity > 0.9
    # another question, another namespace: no flight to join
    assert await flights.find("ns", OTHER, await embedder.embed(OTHER), verifier) is None
    assert await flights.find("ns2", PARA, await embedder.embed(PARA), verifier) is None
    answer = CacheEntry(200, [], body=b"{}")
    waiting = asyncio.ensure_future(joined.wait(5))
    leader.finish(answer)
    assert await waiting is answer
    assert len(flights) == 0  # a finished flight is no longer found
    assert await flights.find("ns", PARA, await embedder.embed(PARA), verifier) is None


async def test_a_failed_or_slow_leader_sends_waiters_upstream(
    embedder: Embedder, verifier: MlpVerifier
) -> None:
    flights = PendingFlights()
    leader = flights.begin("ns", Q, await embedder.embed(Q))
    joined = await flights.find("ns", PARA, await embedder.embed(PARA), verifier)
    assert joined is not None
    assert await joined.wait(0.01) is None  # too slow: the waiter goes upstream itself
    leader.fail()
    assert await joined.wait(1) is None


async def test_word_swaps_do_not_join(embedder: Embedder, verifier: MlpVerifier) -> None:
    flights = PendingFlights()
    a = "Is the Tabaci a tributary of the Leurda?"
    flights.begin("ns", a, await embedder.embed(a))
    b = "Is the Leurda a tributary of the Tabaci?"
    assert await flights.find("ns", b, await embedder.embed(b), verifier) is None


async def test_a_learned_bar_decides_when_given(embedder: Embedder, verifier: MlpVerifier) -> None:
    flights = PendingFlights()
    flights.begin("ns", Q, await embedder.embed(Q))
    closed = Bar(1.01, 1.01, False, float("nan"), 1.0, 0)
    wide = Bar(0.5, 0.0, True, 0.0, 0.05, 100)
    vec = await embedder.embed(PARA)
    assert await flights.find("ns", PARA, vec, verifier, closed) is None
    joined = await flights.find("ns", PARA, vec, verifier, wide)
    assert joined is not None and joined.score >= 0
    assert isinstance(joined.similarity, float) and not np.isnan(joined.similarity)
