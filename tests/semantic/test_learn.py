"""A route with an error budget: labels from misses open its bar, wrong audits close it again."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry

from cache.codec import CacheEntry
from cache.semantic.answers import ExactMatch
from cache.semantic.budget import BudgetGrid
from cache.semantic.learn import RouteBudget
from cache.semantic.metrics import SemanticMetrics
from cache.semantic.route import SemanticRoute
from cache.semantic.stage import SemanticStage
from cache.semantic.verifier import MlpVerifier
from cache.settings import SemanticPolicy
from tests.semantic.test_route import chat

PAIRS = [
    ("How do I reset my password?", "How can I reset my password?"),
    ("What is the best way to learn Python?", "What's the best way to learn Python?"),
    ("How do I cancel my subscription?", "How can I cancel my subscription?"),
    ("How do I change my email address?", "How can I change my email address?"),
]


def answer(text: str) -> CacheEntry:
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}
    return CacheEntry(200, [], body=json.dumps(body).encode(), kind="chat")


def budget_route(
    stage: SemanticStage, verifier: MlpVerifier, metrics: SemanticMetrics
) -> SemanticRoute:
    policy = SemanticPolicy(enabled=True, max_error_rate=0.5, min_labels=3)
    sr = SemanticRoute(stage, "chat", policy, verifier)
    grid = BudgetGrid(0.5, verifier.floor, verifier.p_min, min_labels=3)
    sr.budget = RouteBudget(
        "chat", grid, ExactMatch(), stage, metrics, audit_rate=0.10, scorer=verifier
    )
    return sr


async def test_labels_from_misses_open_the_bar(stage: SemanticStage, verifier: MlpVerifier) -> None:
    metrics = stage.metrics
    sr = budget_route(stage, verifier, metrics)
    assert sr.budget is not None and not sr.budget.bar().open
    for i, (q, para) in enumerate(PAIRS[:3]):
        await sr.remember(chat(q, temperature=0), "t", f"k{i}")
        res = await sr.search(chat(para, temperature=0), "t")
        # still learning: a miss, with the candidate it did not serve
        assert res.hit is None and res.candidate is not None
        assert res.candidate.exact_key == f"k{i}"
        sr.label_after_miss(chat(para, temperature=0), "t", res.candidate, answer(q), answer(q))
        await sr.budget.drain()
    # three agreeing labels prove a bar at this (loose) budget: the same paraphrase now hits
    res = await sr.search(chat(PAIRS[0][1], temperature=0), "t")
    assert res.hit is not None and res.hit.exact_key == "k0"
    labels = metrics.labels.labels("chat", "miss", "agree")._value.get()
    assert labels == 3
    assert metrics.bar_open.labels("chat")._value.get() == 1


async def test_a_wrong_audited_hit_tightens_the_bar_and_demotes_the_entry(
    stage: SemanticStage, verifier: MlpVerifier
) -> None:
    sr = budget_route(stage, verifier, stage.metrics)
    assert sr.budget is not None
    for i, (q, para) in enumerate(PAIRS[:3]):
        await sr.remember(chat(q, temperature=0), "t", f"k{i}")
        res = await sr.search(chat(para, temperature=0), "t")
        assert res.candidate is not None
        sr.label_after_miss(chat(para, temperature=0), "t", res.candidate, answer(q), answer(q))
    await sr.budget.drain()
    q, para = PAIRS[0]
    res = await sr.search(chat(para, temperature=0), "t")
    assert res.hit is not None and res.hit.exact_key == "k0"

    async def fresh() -> CacheEntry:
        return answer("something else entirely")

    for _ in range(3):  # the audited hit's answer differs from the stored one
        sr.audit(chat(para, temperature=0), "t", res.hit, answer(q), fresh)
    await sr.budget.drain()
    assert stage.metrics.audits.labels("chat", "disagree")._value.get() == 3
    assert not sr.budget.bar().open  # 3 of 6 wrong: the bound is over even this budget
    demoted = next(e for e in stage.entries.values() if e.exact_key == "k0")
    assert demoted.bar > res.hit.score  # only a closer match may reuse k0 now
    again = await sr.search(chat(para, temperature=0), "t")
    assert again.hit is None


def test_audits_stay_within_ten_percent_of_hits(
    stage: SemanticStage, verifier: MlpVerifier
) -> None:
    sr = budget_route(stage, verifier, SemanticMetrics(CollectorRegistry()))
    assert sr.budget is not None
    from cache.semantic.records import SemanticHit

    hit = SemanticHit("k", 0.95, 0.6)
    audited = sum(sr.budget.should_audit(hit) for _ in range(1000))
    assert 0 < audited <= 100


async def test_without_the_keys_search_is_todays_lookup(
    stage: SemanticStage, verifier: MlpVerifier
) -> None:
    sr = SemanticRoute(stage, "chat", SemanticPolicy(enabled=True), verifier)
    await sr.remember(chat(PAIRS[0][0], temperature=0), "t", "k")
    res = await sr.search(chat(PAIRS[0][1], temperature=0), "t")
    assert res.hit is not None and res.candidate is None and sr.budget is None
    assert not sr.should_audit(chat(PAIRS[0][1], temperature=0), res.hit)


async def test_labels_past_the_in_flight_bound_are_shed_and_counted(
    stage: SemanticStage, verifier: MlpVerifier
) -> None:
    # A judge that never answers: label work must not pile up without bound.
    import asyncio

    from cache.semantic.learn import MAX_PENDING
    from cache.semantic.records import Candidate

    stalled = asyncio.Event()

    class Stalled:
        async def agree(self, question: str, stored: str, fresh: str) -> bool | None:
            await stalled.wait()
            return True

    metrics = stage.metrics
    grid = BudgetGrid(0.5, verifier.floor, verifier.p_min, min_labels=3)
    budget = RouteBudget("chat", grid, Stalled(), stage, metrics, 0.1, scorer=verifier)
    cand = Candidate("k0", 0.95, 0.6, served_by_bar=False)
    for _ in range(MAX_PENDING + 40):
        budget.label_after_miss(cand, "q", answer("a"), answer("b"))
    await asyncio.sleep(0)
    assert len(budget._tasks) == MAX_PENDING
    assert budget.label_outcomes["miss", "shed"] == 40
    assert metrics.labels.labels("chat", "miss", "shed")._value.get() == 40
    # an audit shed before it asked anything is no audit: the 10 % cap is not spent on it
    from cache.semantic.records import SemanticHit

    for _ in range(10):
        assert budget.should_audit(SemanticHit("k0", 0.97, 0.6)) is (budget.audits == 1)
    assert budget.audits == 1

    async def never() -> CacheEntry | None:
        raise AssertionError("a shed audit must not call the upstream")

    budget.audit(SemanticHit("k0", 0.97, 0.6), "q", answer("a"), never)
    assert budget.audits == 0 and budget.label_outcomes["audit", "shed"] == 1
    stalled.set()
    await budget.drain()
    assert grid.labels.sum() == MAX_PENDING  # the ones kept all landed


async def test_metrics_follow_a_bar_that_moves_because_labels_faded(
    stage: SemanticStage, verifier: MlpVerifier
) -> None:
    # No Redis: nothing reloads the counts, so the lookups themselves must republish.
    now = [1000.0]
    grid = BudgetGrid(
        0.5, verifier.floor, verifier.p_min, min_labels=3, half_life=60.0, clock=lambda: now[0]
    )
    metrics = stage.metrics
    budget = RouteBudget("chat", grid, ExactMatch(), stage, metrics, 0.1, scorer=verifier)
    for _ in range(3):
        grid.label(0.97, 0.6, agree=True)
    budget.publish()
    assert metrics.bar_open.labels("chat")._value.get() == 1
    now[0] += 600.0  # ten half-lives: the three labels weigh 0.003 together
    budget.observe(0.97, 0.6)
    assert metrics.bar_open.labels("chat")._value.get() == 0


async def test_audits_waiting_on_the_upstream_are_bounded(
    stage: SemanticStage, verifier: MlpVerifier
) -> None:
    """Audits share the route's upstream pool with client misses: while MAX_AUDITS_IN_FLIGHT
    wait on a slow upstream, a hit due for one is not audited, and the next hit after one
    comes back is (the credit waits, it does not pile up)."""
    import asyncio

    from cache.semantic.learn import MAX_AUDITS_IN_FLIGHT
    from cache.semantic.records import SemanticHit

    grid = BudgetGrid(0.5, verifier.floor, verifier.p_min, min_labels=3)
    budget = RouteBudget("chat", grid, ExactMatch(), stage, stage.metrics, 0.1, scorer=verifier)
    slow = asyncio.Event()
    asked = 0

    async def upstream() -> CacheEntry | None:
        nonlocal asked
        asked += 1
        await slow.wait()
        return answer("a")

    hit = SemanticHit("k0", 0.97, 0.6)
    for _ in range(400):  # 10 % of 400 hits would be 40 audits
        if budget.should_audit(hit):
            budget.audit(hit, "q", answer("a"), upstream)
    await asyncio.sleep(0)
    assert asked == budget.audits == MAX_AUDITS_IN_FLIGHT
    slow.set()
    await budget.drain()
    assert budget.should_audit(hit)  # one is due at once now: the next hit is audited


async def test_a_refuted_tenants_lookups_do_not_count_in_the_routes_volume(
    stage: SemanticStage, verifier: MlpVerifier
) -> None:
    """The region a route serves is the one with the most lookups: a tenant its own labels
    refute is served nothing there, so its lookups must not steer that choice (before, they
    did, and reached the fleet's shared counts too)."""
    sr = budget_route(stage, verifier, stage.metrics)
    assert sr.budget is not None
    grid = sr.budget.grid
    q, para = PAIRS[0]
    for tenant in ("bad", "good"):  # (each tenant's entries are its own)
        await sr.remember(chat(q, temperature=0), tenant, f"k-{tenant}")
    volume = float(grid.volume.sum())
    await sr.search(chat(para, temperature=0), "bad")
    assert grid.volume.sum() == volume + 1  # not refuted yet: counted
    for _ in range(3):  # its own answers to that paraphrase disagree: refuted
        res = await sr.search(chat(para, temperature=0), "bad")
        assert res.candidate is not None
        sr.label_after_miss(
            chat(para, temperature=0), "bad", res.candidate, answer(q), answer("no")
        )
        await sr.budget.drain()
    assert sr.budget.guard is not None
    assert sr.budget.guard.refuted("bad", grid.bar())
    volume = float(grid.volume.sum())
    await sr.search(chat(para, temperature=0), "bad")
    assert grid.volume.sum() == volume  # refuted: not counted
    await sr.search(chat(para, temperature=0), "good")
    assert grid.volume.sum() == volume + 1
