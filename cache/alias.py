"""Request bytes seen before → their cache key, so an exact repeat skips parsing.

Bounded in bytes, oldest first out. Only the key and the request's framing (its `Answers`, asked
again before an entry is served) are kept: the parsed body would cost several times its bytes.
The tenant is part of the alias (hashed by the caller, so even this in-process map never holds
a credential in clear).
"""

from __future__ import annotations

from cache.asks import Answers
from cache.keys import CacheKey

# (route, method, path and query, content type, Inference-Header-Content-Length, tenant hash,
# body): every request header the parser reads, so the same bytes under another split or type
# are parsed afresh (and refused the same way) rather than served from the alias
AliasKey = tuple[str, str, str, str, str, bytes, bytes]

MAX_BODY = 16 << 10
_MAX_BYTES = 16 << 20
_OVERHEAD = 512


class AliasMap:
    __slots__ = ("_bytes", "_map")

    def __init__(self) -> None:
        # alias -> (key, framing, pin): pin is the created_at of the one entry the alias may
        # serve as stored (None: any entry under the key)
        self._map: dict[AliasKey, tuple[CacheKey, Answers, float | None]] = {}
        self._bytes = 0

    def get(self, alias: AliasKey) -> tuple[CacheKey, Answers, float | None] | None:
        return self._map.get(alias)

    def remember(
        self, alias: AliasKey, key: CacheKey, framing: Answers, pin: float | None = None
    ) -> None:
        """pin: for answers that echo something of the request the key leaves out (a v2 `id`),
        the entry known to carry this request's value; a refill under the same key (after a
        purge or the TTL, by a request with another id) is then not served by the alias."""
        body = alias[-1]
        if len(body) > MAX_BODY:
            return
        if alias in self._map:
            self._map[alias] = (key, framing, pin)  # (a re-pin after a refill)
            return
        self._map[alias] = (key, framing, pin)
        self._bytes += len(body) + _OVERHEAD
        while self._bytes > _MAX_BYTES:
            old = next(iter(self._map))
            del self._map[old]
            self._bytes -= len(old[-1]) + _OVERHEAD
