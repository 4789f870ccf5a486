"""cache.tiers.delete_journal: the deletes a process could not send outlive it, in a file the
next process on the host takes; a live process's file is never taken."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from redis.asyncio import Redis

from cache.codec import CacheEntry
from cache.metrics import CacheMetrics
from cache.tiers import delete_journal
from cache.tiers.delete_journal import DeleteJournal
from cache.tiers.redis import RedisTier
from tests.support.servers import RedisServer
from tests.unit.cache.conftest import redis_settings

URL, PREFIX = "redis://127.0.0.1:6379/0", "lg:"


def _journals(directory: Path) -> list[str]:
    return [p.read_text() for p in directory.glob("undeleted-*.log")]


def test_a_live_processs_keys_are_its_own_a_gone_ones_are_taken(tmp_path: Path) -> None:
    a = DeleteJournal.open(tmp_path, URL, PREFIX)
    assert a is not None and a.taken == {}
    a.append("r.m.t.one", True)
    a.append("r.m.t.two", False)
    b = DeleteJournal.open(tmp_path, URL, PREFIX)  # A still runs: its file is locked
    assert b is not None and b.taken == {}
    b.append("r.m.t.three", True)
    assert b.path is not None and b.path != a.path
    other = DeleteJournal.open(tmp_path, URL, "other:")  # another prefix: none of theirs
    assert other is not None and other.taken == {}
    other.append("r.m.t.theirs", True)
    a.close()
    b.close()  # both gone: the next process takes both files' keys into one
    c = DeleteJournal.open(tmp_path, URL, PREFIX)
    assert c is not None
    assert c.taken == {"r.m.t.one": True, "r.m.t.two": False, "r.m.t.three": True}
    assert sorted(tmp_path.glob("undeleted-*.log")) == sorted([c.path, other.path])
    c.close()
    other.close()
    d = DeleteJournal.open(tmp_path, URL, PREFIX)  # C stopped before sending them: still there
    assert d is not None and set(d.taken) == {"r.m.t.one", "r.m.t.two", "r.m.t.three"}
    d.rewrite({})
    d.close()
    e = DeleteJournal.open(tmp_path, URL, PREFIX)
    assert e is not None and e.taken == {}
    e.close()


def test_a_line_a_crash_cut_short_is_dropped(tmp_path: Path) -> None:
    a = DeleteJournal.open(tmp_path, URL, PREFIX)
    assert a is not None
    a.append("r.m.t.whole", True)
    a.close()
    with a.path.open("a") as fh:
        fh.write("r.m.t.cu")  # no tab: the key itself may be cut
    b = DeleteJournal.open(tmp_path, URL, PREFIX)
    assert b is not None and b.taken == {"r.m.t.whole": True}
    b.close()


def test_bytes_that_are_not_utf8_cost_their_line_not_the_start(tmp_path: Path) -> None:
    """A file a power loss or a disk error left with bytes that are not UTF-8: the lines around
    them still count. Before, reading it raised UnicodeDecodeError out of RedisTier's
    constructor, and the gateway failed to start, at every restart, until it was removed."""
    a = DeleteJournal.open(tmp_path, URL, PREFIX)
    assert a is not None
    a.append("r.m.t.before", True)
    a.close()
    assert a.path is not None
    with a.path.open("ab") as fh:
        fh.write(b"r.m.t.\xff\xfe\t1\n\x80garbage\nr.m.t.after\t0\n")
    b = DeleteJournal.open(tmp_path, URL, PREFIX)
    assert b is not None and b.taken == {"r.m.t.before": True, "r.m.t.after": False}
    b.close()


def test_an_unusable_directory_is_no_journal(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert DeleteJournal.open(blocker / "dir", URL, PREFIX) is None


async def test_a_tier_hands_its_waiting_delete_to_the_next_tier(
    redis_server: RedisServer, metrics: CacheMetrics, tmp_path: Path
) -> None:
    settings = redis_settings(
        redis_server.url, breaker={"failures": 1, "open_s": 60}, journal_dir=str(tmp_path)
    )
    key = "r0.m0.t0.k-journal"
    probe = Redis.from_url(redis_server.url)
    a = RedisTier(settings, metrics)
    try:
        await a.put(key, CacheEntry(200, [], body=b'{"old":1}', ttl=60.0, model="m", kind="chat"))
        a.breaker.failure()  # Redis marked down for a minute: A sends nothing
        await a.delete(key)
    finally:
        await a.aclose()  # A stops with the delete waiting
    stored = settings.key_prefix + "e:" + key
    assert await probe.exists(stored) == 1
    b = RedisTier(settings, metrics)
    told: list[list[str]] = []

    async def announce(keys: list[str]) -> None:
        told.append(keys)

    b.on_late_delete = announce
    try:
        assert b.pending(key) and await b.get(key) is None  # not read back meanwhile
        b.resume()  # (what Cache.open does)
        for _ in range(400):
            if await probe.exists(stored) == 0 and told:
                break
            await asyncio.sleep(0.05)
        assert await probe.exists(stored) == 0 and told == [[key]]
        assert not b.pending(key)
        assert _journals(tmp_path) == [""]
    finally:
        await b.aclose()
        await probe.aclose()


def test_a_process_with_nothing_to_keep_holds_no_file(tmp_path: Path) -> None:
    a = DeleteJournal.open(tmp_path, URL, PREFIX)
    assert a is not None
    a.rewrite({})  # (what settling with nothing waiting does)
    assert a.path is None and list(tmp_path.iterdir()) == []
    a.close()


async def test_a_long_outage_does_not_grow_the_file_without_bound(
    redis_server: RedisServer,
    metrics: CacheMetrics,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis marked down for the whole test: every delete of the same few keys appends a line.
    Before, the file was compacted only once a delete landed (settle), so through an outage it
    grew by a line per failed delete without bound (a pod's state emptyDir has a size limit
    whose excess evicts the pod); now it is rewritten with the keys still waiting once it
    passes the bound, and they all still count."""
    monkeypatch.setattr(delete_journal, "COMPACT_BYTES", 4096)  # (8 MiB: ~100k deletes)
    settings = redis_settings(
        redis_server.url, breaker={"failures": 1, "open_s": 3600}, journal_dir=str(tmp_path)
    )
    a = RedisTier(settings, metrics)
    keys = [f"r0.m0.t0.k-outage-{i}" for i in range(3)]
    try:
        a.breaker.failure()  # marked down: nothing is sent
        for _ in range(100):  # ~25 kB of lines
            for key in keys:
                await a.delete(key)
        journal = a.undeleted.journal
        assert journal is not None and journal.path is not None
        assert journal.path.stat().st_size <= 4096
    finally:
        await a.aclose()
    b = DeleteJournal.open(tmp_path, settings.url or "", settings.key_prefix)
    assert b is not None and b.taken == dict.fromkeys(keys, True)
    b.close()


_REWRITE_PAST_LIMIT = """
import resource, signal, sys
from pathlib import Path
from cache.tiers.delete_journal import DeleteJournal
directory = Path(sys.argv[1])
j = DeleteJournal.open(directory, "redis://127.0.0.1:6379/0", "lg:")
j.append("r.m.t.waiting", True)
j.close()
j = DeleteJournal.open(directory, "redis://127.0.0.1:6379/0", "lg:")
assert j.taken == {"r.m.t.waiting": True}, j.taken
# files past 4 KiB cannot be written (EFBIG, as on a full disk): the rewrite stops half-way
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
keys = {f"r.m.t.new{i:05d}": False for i in range(400)}
keys["r.m.t.waiting"] = True
j.rewrite(keys)
"""


def test_a_rewrite_that_cannot_finish_keeps_the_keys_the_file_held(tmp_path: Path) -> None:
    """A compaction cut short (here a file-size limit; a kill is the same window) leaves the
    journal as it was: before, it was truncated first, and the waiting keys were gone."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _REWRITE_PAST_LIMIT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "could not be written" in done.stderr  # logged, not raised
    after = DeleteJournal.open(tmp_path, URL, PREFIX)
    assert after is not None and after.taken == {"r.m.t.waiting": True}
    assert not list(tmp_path.glob("*.new"))  # the half-written side file is gone
    after.close()


def test_a_rewrite_replaces_the_file_and_the_process_keeps_its_lock(tmp_path: Path) -> None:
    a = DeleteJournal.open(tmp_path, URL, PREFIX)
    assert a is not None
    for i in range(3):
        a.append(f"r.m.t.k{i}", False)
    a.rewrite({"r.m.t.k2": True})
    a.append("r.m.t.k3", False)  # appends go on after the rename, to the new file
    assert _journals(tmp_path) == ["r.m.t.k2\t1\nr.m.t.k3\t0\n"]
    b = DeleteJournal.open(tmp_path, URL, PREFIX)  # A still holds the renamed file
    assert b is not None and b.taken == {}
    b.close()
    a.close()
    c = DeleteJournal.open(tmp_path, URL, PREFIX)
    assert c is not None and c.taken == {"r.m.t.k2": True, "r.m.t.k3": False}
    c.close()


_CLAIM_PAST_LIMIT = """
import resource, signal, sys
from pathlib import Path
from cache.tiers.delete_journal import DeleteJournal
directory = Path(sys.argv[1])
url, prefix = "redis://127.0.0.1:6379/0", "lg:"
a = DeleteJournal.open(directory, url, prefix)
b = DeleteJournal.open(directory, url, prefix)
a.append("r.m.t.a" + "x" * 3000, True)
b.append("r.m.t.b" + "y" * 3000, False)
a.close()
b.close()
# each file fits under 4 KiB, both keys in one file do not (EFBIG, as on a full disk)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
c = DeleteJournal.open(directory, url, prefix)
assert len(c.taken) == 2, c.taken
"""


def test_a_claim_whose_merge_cannot_be_written_keeps_the_files_it_took(tmp_path: Path) -> None:
    """Two gone processes' files, merged into one at a claim that cannot write (a full disk):
    the file whose keys did not make it into the merge is kept for the next process. Before,
    it was removed anyway, and its keys were only in the memory of the process that took it."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _CLAIM_PAST_LIMIT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "could not be written" in done.stderr
    after = DeleteJournal.open(tmp_path, URL, PREFIX)
    assert after is not None
    assert sorted(k[:7] for k in after.taken) == ["r.m.t.a", "r.m.t.b"]
    after.close()
