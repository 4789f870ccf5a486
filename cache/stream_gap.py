"""Did a stream tail miss events that the stream's length cap trimmed before it read them?

The purge fan-out and the semantic sync tail capped Redis Streams (`XADD MAXLEN ~`) from the
last id they read. A tail cut off from Redis for longer than the cap covers (a partition, a
stall, a long GC pause in a busy fleet) resumes from that id, and XREAD silently returns only
what is left: the events trimmed in between are gone without a sign. For the purge stream
(1,000 events, and every invalidating request adds one) those were deletes, and the process
went on serving from memory what the rest of the fleet had deleted, until the TTL.

`missed` tells the tail. Trimming removes the oldest entries first, so a tail has missed nothing
while the oldest entry the stream still holds is at or before the last one it read. Once the
stream's first entry is past it, the entry the tail read last is gone, and so may be unread ones
after it: that counts as missed (it can be a false alarm only when the trim stopped exactly at
the tail's position, i.e. when the tail was at the edge of losing events anyway). That holds
for a stream that never lost an entry of its own, too: one made anew after the tail read from
the old one (Redis restarted empty or was flushed, and the fleet wrote again before the tail's
next read) holds none of the old one's events, and those the tail never read are gone (before,
`entries-added == length` answered "nothing missed" for any position). Only a tail at the start
reads every entry a stream holds: it missed something if the stream ever lost one. A stream
that is gone while the tail had read from it counts as missed (what was announced before it went
is unknown); an empty one, when ids were made after the tail's (its entries were trimmed).

The tails ask after their first read, after each read that follows a failure (a reconnect) and
after a read that filled its batch (the tail is behind): a caught-up tail cannot fall a whole
cap behind between two reads, and an idle one is never trimmed past (trimming happens on XADD,
after the entry it read). The caller passes the id it read from *before* the XREAD whose result
it is about to apply, and asks after that XREAD: a trim between the two can only raise a false
alarm (a tail at the edge of the cap), never hide a gap the XREAD's result has.
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import ResponseError

from cache.redis_client import AnyRedis

START = "0-0"  # a tail's position before a stream's first entry


def _id(raw: Any) -> tuple[int, int]:
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


async def missed(redis: AnyRedis, key: str, read_from: str) -> bool:
    """Whether entries of stream `key` after `read_from` were removed before the tail read them
    (see the module docstring). Redis errors propagate: the tail's retry handles them."""
    try:
        info: Any = await redis.xinfo_stream(key)
    except ResponseError as exc:
        if "no such key" not in str(exc).lower():
            raise
        return read_from != START
    newest = _id(info.get("last-generated-id") or START)
    if newest < _id(read_from):
        # the stream never got as far as the tail read: a failover's replica that was behind,
        # or a stream made anew by a host whose clock is behind (what comes next is older
        # than the tail's position, and XREAD from there would skip it)
        return True
    length = int(info.get("length") or 0)
    if length == 0:
        # nothing left to read (Redis >= 7.0 then records 0-0 as the first id): missed if
        # entries were made after the tail's position
        return newest > _id(read_from)
    added = info.get("entries-added")  # Redis >= 7.0
    if read_from == START and added is not None:
        return int(added) != length
    # Redis >= 7.0 records the first id; older ones show the first entry
    first = info.get("recorded-first-entry-id")
    if first is None:
        entry = info.get("first-entry")
        if not entry:
            return False
        first = entry[0]
    return _id(first) > _id(read_from)
