"""CacheEntry and its versioned msgpack form (the bytes Redis holds).

An entry is either a whole body or the list of SSE events of a finished stream. Anything that
does not decode to the current layout raises CodecError; callers treat it as a miss. So does a
status outside 100-599 or a header that is not a token and a value free of control characters
(CR, LF, NUL, DEL...): the entry is replayed to clients as it stands.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

import msgpack

from cache.errors import CodecError

VERSION = 1
_OVERHEAD = 256  # Python object overhead per entry, so many tiny entries still count


@dataclass(slots=True)
class CacheEntry:
    status: int
    headers: list[tuple[str, str]]
    body: bytes | None = None
    events: list[bytes] | None = None
    created_at: float = field(default_factory=time.time)
    ttl: float = 3600.0
    model: str | None = None
    policy_version: str = ""
    kind: str = ""
    # Derived forms a caller computes once per entry (e.g. a rendered response); never stored.
    memo: dict[object, object] = field(default_factory=dict, compare=False, repr=False)
    # False: an answer its flight's waiters share but that is not kept (the upstream said
    # no-cache or max-age=0, the client no-store): a paraphrase may not be served it. Never
    # encoded: an entry read from a tier was stored.
    reusable: bool = field(default=True, compare=False, repr=False)

    @property
    def expires_at(self) -> float:
        return self.created_at + self.ttl

    def age(self, now: float | None = None) -> float:
        return max(0.0, (time.time() if now is None else now) - self.created_at)

    def size(self) -> int:
        n = _OVERHEAD + sum(len(k) + len(v) + 16 for k, v in self.headers)
        if self.body is not None:
            n += len(self.body)
        if self.events is not None:
            n += sum(len(e) + 8 for e in self.events)
        return n


def encode(entry: CacheEntry) -> bytes:
    packed: bytes = msgpack.packb(
        [
            VERSION,
            entry.status,
            [[k, v] for k, v in entry.headers],
            entry.body,
            entry.events,
            entry.created_at,
            entry.ttl,
            entry.model,
            entry.policy_version,
            entry.kind,
        ],
        use_bin_type=True,
    )
    return packed


# a field name is a token; no value holds a control character but HTAB, nor DEL (RFC 9110 5.5)
_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_UNSAFE_IN_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def _header_ok(name: object, value: object) -> bool:
    """A header line a client may be sent: two strings, a token for a name, no CR, LF, NUL or
    other control character in the value (a tampered entry could otherwise split the response
    it is replayed into; aiohttp's writer refuses the rest mid-response)."""
    return (
        isinstance(name, str)
        and isinstance(value, str)
        and _NAME.fullmatch(name) is not None
        and _UNSAFE_IN_VALUE.search(value) is None
    )


def decode(data: bytes) -> CacheEntry:
    try:
        doc = msgpack.unpackb(data, raw=False, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise CodecError(f"entry is not msgpack: {exc}") from None
    if not isinstance(doc, list) or not doc or doc[0] != VERSION or len(doc) != 10:
        raise CodecError("entry has an unknown layout or version")
    _, status, headers, body, events, created_at, ttl, model, policy_version, kind = doc
    ok = (
        type(status) is int
        and 100 <= status <= 599
        and isinstance(headers, list)
        and all(isinstance(h, list) and len(h) == 2 and _header_ok(*h) for h in headers)
        and (body is None or isinstance(body, bytes))
        and (
            events is None
            or (isinstance(events, list) and all(isinstance(e, bytes) for e in events))
        )
        and (body is None) != (events is None)
        and isinstance(created_at, (int, float))
        and isinstance(ttl, (int, float))
        and (model is None or isinstance(model, str))
        and isinstance(policy_version, str)
        and isinstance(kind, str)
    )
    if not ok:
        raise CodecError("entry fields have the wrong types")
    return CacheEntry(
        status=status,
        headers=[(k, v) for k, v in headers],
        body=body,
        events=events,
        created_at=float(created_at),
        ttl=float(ttl),
        model=model,
        policy_version=policy_version,
        kind=kind,
    )
