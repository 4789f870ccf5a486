"""The tenant guard's labels shared between processes through a real Redis
(cache.semantic.tenant_labels): a tenant refuted by its own wrong labels at one sidecar is kept
apart at the others and after a restart. Before, each sidecar had to learn it from the wrong
labels it saw itself, and a restarted one served it at the route's bar again."""

from __future__ import annotations

import signal
import time
import uuid

import msgpack
import pytest
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from cache.redis_client import connect
from cache.semantic.answers import ExactMatch
from cache.semantic.budget import BudgetGrid
from cache.semantic.learn import RouteBudget
from cache.semantic.metrics import SemanticMetrics
from cache.semantic.route import SemanticRoute
from cache.semantic.stage import SemanticStage
from cache.semantic.tenant_labels import TenantLabelShare
from cache.semantic.verifier import MlpVerifier
from cache.settings import SemanticPolicy
from tests.semantic.test_learn import PAIRS, answer
from tests.semantic.test_route import chat
from tests.support.servers import RedisServer
from tests.unit.cache.conftest import redis_settings

HALF_LIFE = 3600.0


def _route(stage: SemanticStage, verifier: MlpVerifier, context: str = "c1") -> SemanticRoute:
    """A budgeted route with its own grid and guard (one per process in a fleet)."""
    policy = SemanticPolicy(enabled=True, max_error_rate=0.5, min_labels=3)
    sr = SemanticRoute(stage, "chat", policy, verifier)
    grid = BudgetGrid(0.5, verifier.floor, verifier.p_min, min_labels=3, half_life=HALF_LIFE)
    metrics = SemanticMetrics(CollectorRegistry())
    sr.budget = RouteBudget(
        "chat", grid, ExactMatch(), stage, metrics, 0.10, scorer=verifier, context=context
    )
    return sr


def _budget(sr: SemanticRoute) -> RouteBudget:
    assert sr.budget is not None and sr.budget.guard is not None
    return sr.budget


def _refuted(sr: SemanticRoute, tenant: str) -> bool:
    b = _budget(sr)
    assert b.guard is not None
    return b.guard.refuted(tenant, b.grid.bar())


@pytest.fixture
def prefix() -> str:
    return f"tl{uuid.uuid4().hex[:8]}:"


async def _share(redis_server: RedisServer, sr: SemanticRoute, prefix: str) -> TenantLabelShare:
    client = connect(redis_settings(redis_server.url), socket_timeout=0.5, max_connections=4)
    share = TenantLabelShare(client, {"chat": _budget(sr)}, prefix, interval=3600)
    await share.start()
    return share


async def _close(share: TenantLabelShare) -> None:
    await share.aclose()
    await share.redis.aclose()


async def test_a_tenant_refuted_at_one_process_is_refuted_at_the_others_and_after_a_restart(
    stage: SemanticStage, verifier: MlpVerifier, redis_server: RedisServer, prefix: str
) -> None:
    a, b = _route(stage, verifier), _route(stage, verifier)
    share_a, share_b = await _share(redis_server, a, prefix), await _share(redis_server, b, prefix)
    try:
        q, para = PAIRS[0]
        await a.remember(chat(q, temperature=0), "bad", "k-bad")
        for _ in range(3):  # at A, the bad tenant's answers to the paraphrase disagree
            res = await a.search(chat(para, temperature=0), "bad")
            assert res.candidate is not None
            a.label_after_miss(
                chat(para, temperature=0), "bad", res.candidate, answer(q), answer("no")
            )
            await _budget(a).drain()
        assert _refuted(a, "bad") and not _refuted(b, "bad")
        assert await share_a.flush() and await share_b.flush()
        assert _refuted(b, "bad")  # B saw none of that traffic
        assert not _refuted(b, "good")
        # A does not count its own labels twice (they come back on its next read)
        before = _budget(a).guard.guarded(_budget(a).grid.bar())  # type: ignore[union-attr]
        assert await share_a.flush()
        after = _budget(a).guard.guarded(_budget(a).grid.bar())  # type: ignore[union-attr]
        assert [g.labels for g in after] == [g.labels for g in before] == [3.0]
    finally:
        await _close(share_a)
        await _close(share_b)
    restarted = _route(stage, verifier)
    share_c = await _share(redis_server, restarted, prefix)
    try:
        assert _refuted(restarted, "bad")  # replayed at start
    finally:
        await _close(share_c)
    # labels made under another labelling context (another scorer or rule) do not count
    other = _route(stage, verifier, context="c2")
    share_d = await _share(redis_server, other, prefix)
    try:
        assert not _refuted(other, "bad")
    finally:
        await _close(share_d)


async def test_replayed_labels_weigh_by_their_age(
    stage: SemanticStage, verifier: MlpVerifier, redis_server: RedisServer, prefix: str
) -> None:
    """Labels past four half-lives are not replayed: a tenant refuted long ago starts afresh;
    the same labels made a moment ago refute it."""
    probe = _route(stage, verifier)
    grid = _budget(probe).grid
    cosine, score = 0.995, float(grid.score_edges[-1]) + 0.001  # served by any open region
    assert grid.cell(cosine, score) is not None
    raw = Redis.from_url(redis_server.url)
    try:
        key = f"{prefix}sem:tenants:chat:c1"
        now = time.time()
        for tenant, at in (("old", now - 5 * HALF_LIFE), ("recent", now - 60)):
            labels = [[tenant, cosine, score, False, at] for _ in range(3)]
            await raw.xadd(key, {"o": "another-process", "d": msgpack.packb(labels)})
    finally:
        await raw.aclose()
    share = await _share(redis_server, probe, prefix)
    try:
        assert _refuted(probe, "recent")
        assert not _refuted(probe, "old")
    finally:
        await _close(share)


async def _flushed(share: TenantLabelShare) -> bool:
    """A flush that succeeds (the first after Redis came back may meet a dead connection)."""
    for _ in range(5):
        if await share.flush():
            return True
    return False


def _wrong_labels(sr: SemanticRoute, n: int) -> None:
    """n wrong labels for the bad tenant, as a label after a miss hands them to guard and share."""
    b = _budget(sr)
    cosine, score = 0.995, float(b.grid.score_edges[-1]) + 0.001
    assert b.on_tenant_label is not None
    for _ in range(n):
        b.count_tenant_label("bad", cosine, score, False, 1.0)
        b.on_tenant_label("bad", cosine, score, False)


def _labels_of(sr: SemanticRoute, tenant: str) -> list[float]:
    b = _budget(sr)
    assert b.guard is not None
    return [g.labels for g in b.guard.guarded(b.grid.bar()) if tenant.startswith(g.tenant)]


async def test_labels_made_while_redis_is_down_reach_the_others_once_it_is_back(
    stage: SemanticStage, verifier: MlpVerifier, prefix: str
) -> None:
    redis = RedisServer().start()
    a, b = _route(stage, verifier), _route(stage, verifier)
    share_a, share_b = await _share(redis, a, prefix), await _share(redis, b, prefix)
    try:
        redis.kill()
        _wrong_labels(a, 3)
        assert not await share_a.flush()  # refused: kept
        redis.start()  # (the same port, empty)
        assert await _flushed(share_a) and await _flushed(share_b)
        assert _labels_of(b, "bad") == [pytest.approx(3.0, abs=0.01)]
    finally:
        await _close(share_a)
        await _close(share_b)
        redis.stop()


async def test_a_batch_sent_again_after_a_lost_reply_counts_once(
    stage: SemanticStage, verifier: MlpVerifier, prefix: str
) -> None:
    """A stalled Redis times the flush out but still runs its XADD once it resumes: the batch
    is sent again under its id, and the others count it once."""
    redis = RedisServer().start()
    assert redis.proc is not None
    a, b = _route(stage, verifier), _route(stage, verifier)
    share_a, share_b = await _share(redis, a, prefix), await _share(redis, b, prefix)
    try:
        _wrong_labels(a, 3)
        redis.proc.send_signal(signal.SIGSTOP)
        try:
            assert not await share_a.flush()  # timed out (the XADD waits in the socket)
        finally:
            redis.proc.send_signal(signal.SIGCONT)
        assert await _flushed(share_a) and await _flushed(share_b)
        # two entries in the stream, one batch (3 labels, faded by the seconds since)
        assert _labels_of(b, "bad") == [pytest.approx(3.0, abs=0.01)]
    finally:
        await _close(share_a)
        await _close(share_b)
        redis.stop()


async def test_an_entry_this_version_cannot_read_stops_neither_replay_nor_the_others(
    stage: SemanticStage, verifier: MlpVerifier, redis_server: RedisServer, prefix: str
) -> None:
    """Entries another version wrote (a label with a field more, a batch that is not a list,
    an origin that is not UTF-8) are skipped, and the readable labels beside them still count.
    Before, unpacking such a label raised out of the reader: at start the semantic stage failed
    to load, and in the flush loop the task died, so this process shared no label again."""
    probe = _route(stage, verifier)
    grid = _budget(probe).grid
    cosine, score = 0.995, float(grid.score_edges[-1]) + 0.001
    key = f"{prefix}sem:tenants:chat:c1"
    raw = Redis.from_url(redis_server.url)

    async def unreadable_then(tenant: str) -> None:
        now = time.time()
        for d in (
            msgpack.packb([[tenant, cosine, score, False, now, "a newer field"]]),
            msgpack.packb(7),
            msgpack.packb([["x", "not a cosine", score, False, now]]),
        ):
            await raw.xadd(key, {"o": "newer-process", "d": d})
        await raw.xadd(key, {"o": b"\xff\xfe", "d": msgpack.packb([])})
        labels = [[tenant, cosine, score, False, now] for _ in range(3)]
        await raw.xadd(key, {"o": "another-process", "d": msgpack.packb(labels)})

    try:
        await unreadable_then("replayed")
        share = await _share(redis_server, probe, prefix)
        try:
            assert _refuted(probe, "replayed")
            await unreadable_then("applied")
            assert await share.flush()
            assert _refuted(probe, "applied")
            assert share._task is not None and not share._task.done()
        finally:
            await _close(share)
    finally:
        await raw.aclose()
