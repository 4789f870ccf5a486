"""The shared index's records in Redis (cache.semantic.sync): their encoding, and the hash that
holds them kept to live records.

Each record's expiry is also a score in a sorted set beside the hash; every process deletes the
expired ones once a minute (one Lua script, PRUNE_BATCH at a time). Without that the hash only
grew, by one ~1.7 KB record per semantic miss, for as long as the fleet ran, and every start
scanned all of it. The keys of the version before embedding spaces (`{<prefix>sem}:...`), which
no process of this version writes, are pruned the same way, and their stream trimmed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, TypeGuard

import msgpack
import numpy as np

from cache.redis_client import AnyRedis
from cache.semantic.records import Entry

PRUNE_BATCH = 500
# The earlier version's stream keeps this long (its readers, processes of that version, read
# within seconds).
LEGACY_LOG_KEEP_S = 600.0

# KEYS[1] the records hash, KEYS[2] their expiries (a sorted set, wall-clock seconds);
# ARGV[1] now, ARGV[2] at most this many. Atomic: a record stored again since it expired has a
# new score and is out of range, so a fresh record is never deleted for its old one.
_PRUNE = """
local keys = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, k in ipairs(keys) do
  redis.call('HDEL', KEYS[1], k)
  redis.call('ZREM', KEYS[2], k)
end
return #keys
"""


def pack(entry: Entry) -> bytes:
    raw: bytes = msgpack.packb(
        {
            "ns": entry.namespace,
            "k": entry.exact_key,
            "t": entry.text,
            "v": np.asarray(entry.vector, np.float32).tobytes(),  # the caller's full vector
            "x": entry.expires_at,
            "b": entry.bar,
        }
    )
    return raw


def unpack(raw: bytes, dim: int) -> Entry:
    """A record; ValueError (and msgpack's errors) for one this process cannot use, a vector of
    another width included (a record cut short: it failed the FAISS add, and with it the start)."""
    return _entry(msgpack.unpackb(raw, raw=False), dim)


def _entry(d: Any, dim: int) -> Entry:
    """Every field checked for its type: a record of the right shape but another layout (a
    string expiry, a null text: junk written into the hash, or another version's) went into
    the index and failed there (`len(None)`, `str > float`), which stopped the rebuild and
    with it the process's sharing for its whole life."""
    if not isinstance(d, dict):
        raise ValueError("a record is a map")
    ns, key, text, raw, expires, bar = (d.get(f) for f in ("ns", "k", "t", "v", "x", "b"))
    if not (isinstance(ns, str) and isinstance(key, str) and isinstance(text, str)):
        raise ValueError("a record's namespace, key and text are strings")
    if not (isinstance(raw, bytes) and _number(expires)):
        raise ValueError("a record's vector is bytes and its expiry a number")
    if not (bar is None or _number(bar)):
        raise ValueError("a record's bar is a number")
    vector = np.frombuffer(raw, dtype=np.float32).copy()
    if vector.shape != (dim,):
        raise ValueError(f"a vector of {vector.size} values, not {dim}")
    if not np.isfinite(vector).all():
        raise ValueError("a vector with a NaN or an infinity")
    return Entry(ns, key, text, vector, float(expires), float(bar or 0.0), shared=True)


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class SharedRecords:
    """The records hash and its expiries; `legacy`: (entries, expiry, log) of the version before
    spaces, None when they are these keys."""

    def __init__(
        self,
        redis: AnyRedis,
        entries_key: str,
        expiry_key: str,
        dim: int,
        legacy: tuple[str, str, str] | None = None,
    ) -> None:
        self.redis = redis
        self.entries_key = entries_key
        self.expiry_key = expiry_key
        self.dim = dim
        self._legacy = legacy
        self._legacy_noted = legacy is None
        self._prune = redis.register_script(_PRUNE)

    async def records(
        self, entries_key: str | None = None, expiry_key: str | None = None
    ) -> AsyncIterator[tuple[str, Entry | None]]:
        """The hash's keys and records (None: unreadable), each one's expiry noted as it goes
        (NX: a record stored again meanwhile keeps its new one), in case it has none yet (kept
        by an earlier version, or its ZADD was lost)."""
        entries_key = entries_key or self.entries_key
        expiry_key = expiry_key or self.expiry_key
        expiries: dict[str, float] = {}
        async for raw_key, raw in self.redis.hscan_iter(entries_key, count=1000):
            key = raw_key.decode(errors="replace") if isinstance(raw_key, bytes) else raw_key
            try:
                doc = msgpack.unpackb(raw, raw=False)
                expiries[raw_key.decode() if isinstance(raw_key, bytes) else key] = float(doc["x"])
            except Exception:
                yield key, None
                continue
            if len(expiries) >= 1000:
                await self._note_expiries(expiry_key, expiries)
            try:  # (a record of another width is noted, so pruned, but not loaded)
                entry: Entry | None = _entry(doc, self.dim)
            except Exception:
                entry = None
            yield key, entry
        await self._note_expiries(expiry_key, expiries)

    async def _note_expiries(self, expiry_key: str, expiries: dict[str, float]) -> None:
        if expiries:
            await self.redis.zadd(expiry_key, expiries, nx=True)
            expiries.clear()

    async def prune(self, at: float) -> int:
        """Delete the records expired at `at` (wall clock); how many went."""
        total = await self._prune_pair(self.entries_key, self.expiry_key, at)
        return total + await self._prune_legacy(at)

    async def _prune_legacy(self, at: float) -> int:
        """The earlier version's hash (no process of this one reads or writes it: left alone it
        stayed in Redis, at its full size, for ever): its records' expiries are noted once
        (records stored there since by a process of that version wait for the next start), then
        pruned like this version's; its stream keeps LEGACY_LOG_KEEP_S."""
        if self._legacy is None:
            return 0
        entries, expiry, stream = self._legacy
        if not self._legacy_noted:
            async for _ in self.records(entries, expiry):
                pass
            self._legacy_noted = True
        await self.redis.xtrim(stream, minid=f"{int((at - LEGACY_LOG_KEEP_S) * 1000)}-0")
        return await self._prune_pair(entries, expiry, at)

    async def _prune_pair(self, entries: str, expiry: str, at: float) -> int:
        total = 0
        while True:
            n = int(await self._prune(keys=[entries, expiry], args=[at, PRUNE_BATCH]))
            total += n
            if n < PRUNE_BATCH:
                return total
