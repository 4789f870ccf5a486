"""A purge that waits for Redis is journaled (cache.tiers.undeleted, cache.tiers.delete_journal):
a process stopped before Redis takes it hands it to the next one on the host, which reads none
of what it matches from Redis meanwhile and runs it once Redis answers. Before, a waiting purge
lived in the process's memory only: the next process served the purged answer from Redis, and
it stayed there until its TTL."""

from __future__ import annotations

import uuid
from pathlib import Path

from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from cache import Cache, CacheEntry, request_directives
from cache.keys import Selector
from cache.settings import CacheSettings
from cache.tenant import tenant_of
from cache.tiers.delete_journal import DeleteJournal
from cache.tiers.undeleted import UndeletedKeys
from tests.support.servers import RedisServer
from tests.unit.cache.cache_pair import ALICE, FIELDS, route
from tests.unit.cache.test_purge_fanout_unprimed import _until as until

BOB = {"Authorization": "Bearer sk-bob"}


def _settings(url: str, journal: Path) -> CacheSettings:
    redis = {"url": url, "key_prefix": f"t{uuid.uuid4().hex[:8]}:", "journal_dir": str(journal)}
    return CacheSettings.model_validate({"tenant_secret": "t" * 32, "redis": redis})


async def test_a_waiting_purge_outlives_its_process(
    own_redis: tuple[RedisServer, Redis], tmp_path: Path
) -> None:
    server, admin = own_redis
    settings = _settings(server.url, tmp_path)
    prefix = settings.redis.key_prefix if settings.redis is not None else ""
    a = Cache(settings, CollectorRegistry())
    await a.open()
    ra = route(a)
    alice, bob = ra.key("m", FIELDS, ALICE), ra.key("m", FIELDS, BOB)
    for k in (alice, bob):
        assert await ra.store(k, CacheEntry(200, [], body=b"answer", ttl=600.0))
    await admin.client_pause(600_000, all=False)  # WRITE: the purge's UNLINK times out
    try:
        out = await a.purge(tenant=tenant_of(ALICE))
        assert isinstance(out["redis"], dict) and out["redis"]["retrying"] is True, out
    finally:
        await a.aclose()  # stopped before Redis took it

    b = Cache(settings, CollectorRegistry())  # the next process on the host
    await b.open()
    try:
        rb = route(b)
        # before: read from Redis and served, the purged answer
        assert await rb.lookup(rb.key("m", FIELDS, ALICE), request_directives(None)) is None
        assert b.redis is not None and b.redis.purges  # taken from A's journal
        assert await rb.lookup(rb.key("m", FIELDS, BOB), request_directives(None)) is not None
        assert await admin.exists(f"{prefix}e:{alice.value}") == 1  # still in Redis

        await admin.client_unpause()
        await until("B never ran A's purge", lambda: b.redis is not None and not b.redis.purges)
        assert await admin.exists(f"{prefix}e:{alice.value}") == 0
        assert await admin.exists(f"{prefix}e:{bob.value}") == 1
        # its line went once it landed: a third process does not purge again what was stored
        assert "*" not in _journaled(tmp_path)
    finally:
        await b.aclose()


def _journaled(directory: Path) -> str:
    journals = list(directory.glob("undeleted-*.log"))
    assert journals
    return "".join(j.read_text() for j in journals)


def test_a_purges_pattern_is_its_selector() -> None:
    for s in (Selector(), Selector("r1"), Selector(None, "m1", "t1"), Selector("r", "m", "t")):
        assert Selector.of_pattern(s.pattern()) == s
    assert Selector.of_pattern("r.m.t.0123") is None  # a key
    assert Selector.of_pattern("junk") is None


def test_a_waiting_purges_line_outlives_the_deletes_settling_until_it_lands(
    tmp_path: Path,
) -> None:
    """The deletes' rewrites (settled, compacted) keep a waiting purge's line: it goes only
    once the purge lands, and the next process takes it as a purge, not as a key."""
    url, prefix = "redis://127.0.0.1:1/0", "p:"
    journal = DeleteJournal.open(tmp_path, url, prefix)
    undeleted = UndeletedKeys(journal=journal)
    undeleted.add("r.m.t.k1")
    undeleted.keep("r.m.t.k1")
    undeleted.keep_purge(Selector("r1").pattern(), True)
    undeleted.discard("r.m.t.k1")  # the delete landed
    undeleted.settle()
    assert _journaled(tmp_path) == "r1.*.*.*\t1\n"
    undeleted.close()

    after = UndeletedKeys(journal=DeleteJournal.open(tmp_path, url, prefix))
    assert after.purges == {"r1.*.*.*": True} and len(after) == 0
    after.purge_done("r1.*.*.*")
    assert _journaled(tmp_path) == ""
    after.close()
