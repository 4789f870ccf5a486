"""The HTTP side of the semantic error budget: stored and fresh answers as CacheEntry.

The request path (gateway/cache_stage.py today, cache/flow.py next) hands these to
SemanticRoute's label hooks: a loader of a candidate's stored entry (read only when the label
is computed, in the background) and an audit fetch (a second upstream call for an audited hit,
read whole, never stored, never shown to a client).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from backends import UpstreamResponse
from cache.cache import RouteCache
from cache.codec import CacheEntry
from gateway.protocols import openai_sse
from gateway.protocols.base import Call

Load = Callable[[], Awaitable[CacheEntry | None]]


def entry_loader(rc: RouteCache, exact_key: str) -> Load:
    async def load() -> CacheEntry | None:
        got = await rc.tiers.lookup(exact_key)
        return None if got is None else got[0]

    return load


async def entry_of(up: UpstreamResponse, call: Call) -> CacheEntry:
    """The whole answer (SSE events or one body); headers are not kept: labels read the text."""
    try:
        raw = await up.read()
    finally:
        close = getattr(up.stream, "aclose", None)
        if close is not None:
            await close()
    if "text/event-stream" in (up.header("Content-Type") or ""):
        return CacheEntry(up.status, [], events=openai_sse.split_events(raw), kind=call.kind)
    return CacheEntry(up.status, [], body=raw, kind=call.kind)


def audit_fetch(fetch: Callable[[], Awaitable[UpstreamResponse]], call: Call) -> Load:
    async def run() -> CacheEntry | None:
        return await entry_of(await fetch(), call)

    return run
