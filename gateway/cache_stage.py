"""The exact-cache stage of the pipeline: the HTTP side of caching.

Reads Cache-Control, asks the route's cache, renders hits in the framing the client asked for
(SSE or one JSON body), runs misses through single flight, tees streams while they go out and
stores them once complete. Sets X-Cache and Age. The cache itself never sees an HTTP object.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web
from multidict import CIMultiDict

from backends import UpstreamError, UpstreamResponse
from cache.cache import RouteCache
from cache.codec import CacheEntry
from cache.keys import CacheKey, tenant_of
from cache.policy import (
    DEFAULT,
    RequestDirectives,
    request_directives,
    response_shareable,
    response_storable,
)
from cache.semantic.route import SemanticRoute
from gateway.cache_render import SSE, Framing, framing_of, kept_headers, render
from gateway.errors import BadGateway, GatewayError
from gateway.headers import downstream_headers
from gateway.protocols import openai_sse
from gateway.protocols.base import Call
from gateway.semantic_labels import audit_fetch, entry_loader

if TYPE_CHECKING:
    import numpy as np

    from gateway.pipeline import Timing

log = logging.getLogger("latentgate.cache_stage")

Fetch = Callable[[], Awaitable[UpstreamResponse]]
Respond = Callable[[UpstreamResponse, dict[str, str]], Awaitable[web.StreamResponse]]


@dataclass(slots=True)
class Outcome:
    """What one backend call produced, as shared with single-flight waiters."""

    entry: CacheEntry | None = None
    error: GatewayError | None = None
    shareable: bool = True
    response: web.StreamResponse | None = None  # the leader's own, already written


# Requests whose exact bytes were seen are remembered (bytes → key and call) so a repeat skips
# parsing and canonicalisation; bounded in bytes, oldest first out.
_ALIAS_MAX_BODY = 16 << 10
_ALIAS_MAX_BYTES = 16 << 20
AliasKey = tuple[str, str, str, str, bytes, bytes]


class CacheStage:
    def __init__(
        self, routes: dict[str, RouteCache], semantic: Mapping[str, SemanticRoute] | None = None
    ) -> None:
        self.routes = routes
        # only the key and the framing: the parsed body would cost several times its bytes
        self._alias: dict[AliasKey, tuple[CacheKey, Framing]] = {}
        self._alias_bytes = 0
        self.semantic = dict(semantic or {})

    def replace_routes(self, routes: dict[str, RouteCache]) -> None:
        """A config reload's new policies. Aliases go too: a changed key policy could make a
        remembered request → key mapping point at an entry the new policy would not match."""
        self.routes = routes
        self._alias = {}
        self._alias_bytes = 0

    def _alias_key(self, request: web.Request, rc: RouteCache, body: bytes) -> AliasKey:
        return (
            rc.route,
            request.method,
            request.path_qs,
            request.headers.get("Content-Type", ""),
            # hashed: even this in-process map never holds a credential in clear
            hashlib.blake2b(tenant_of(request.headers, rc.tenant_headers).encode()).digest(),
            body,
        )

    def _remember(
        self, request: web.Request, rc: RouteCache, body: bytes, key: CacheKey, call: Call
    ) -> None:
        if len(body) > _ALIAS_MAX_BODY:
            return
        akey = self._alias_key(request, rc, body)
        if akey in self._alias:
            return
        self._alias[akey] = (key, framing_of(call))
        self._alias_bytes += len(body) + 512
        while self._alias_bytes > _ALIAS_MAX_BYTES:
            old = next(iter(self._alias))
            del self._alias[old]
            self._alias_bytes -= len(old[-1]) + 512

    def fast_hit(
        self, request: web.Request, route: str, body: bytes, timing: Timing
    ) -> web.Response | None:
        """An L1 hit for bytes seen before, without parsing; None sends the request the long way."""
        rc = self.routes.get(route)
        if rc is None or len(body) > _ALIAS_MAX_BODY:
            return None
        headers = request.headers
        if "Cache-Control" in headers or "Pragma" in headers:
            return None
        known = self._alias.get(self._alias_key(request, rc, body))
        if known is None:
            return None
        key, framing = known
        entry = rc.lookup_l1(key, DEFAULT)
        if entry is None:
            return None
        timing.add("cache", timing.start)
        return render(entry, framing, "hit", timing.header())

    async def serve(
        self,
        request: web.Request,
        rc: RouteCache,
        call: Call,
        body: bytes,
        fetch: Fetch,
        respond: Respond,
        timing: Timing,
        t: float,
    ) -> web.StreamResponse:
        directives = request_directives(
            request.headers.get("Cache-Control"), request.headers.get("Pragma")
        )
        key = rc.key(call.model, call.key_fields, request.headers)
        self._remember(request, rc, body, key, call)
        found = None
        if directives.lookup:
            hit = rc.lookup_l1(key, directives)
            found = (hit, "memory") if hit is not None else await rc.lookup(key, directives)
        else:
            rc.bypass()
        t = timing.add("cache", t)
        if found is not None:
            resp = render(found[0], framing_of(call), "hit", timing.header())
            if resp is not None:
                return resp  # (an entry that cannot take this framing is treated as a miss)
        vector = None  # the semantic vector of this call, embedded once for lookup and store
        if found is None and directives.lookup:
            sem, vector = await self._semantic_lookup(rc, call, key, directives, timing, t, fetch)
            if sem is not None:
                return sem
        if not directives.store:
            return await respond(await fetch(), {"X-Cache": "bypass"})
        x_cache = "miss" if directives.lookup else "bypass"

        async def compute() -> Outcome:
            async with rc.lease(key) as peer:
                if peer is not None:
                    return Outcome(entry=peer)
                return await self._fetch(
                    request, rc, call, key, directives, fetch, timing, x_cache, vector
                )

        outcome, led = await rc.coalesce(key, compute, lambda o: o.shareable)
        if led and outcome.response is not None:
            return outcome.response
        if outcome.error is not None:
            raise outcome.error
        assert outcome.entry is not None
        resp = render(outcome.entry, framing_of(call), x_cache, timing.header())
        if resp is None:
            raise BadGateway("the upstream answer could not be converted to the requested framing")
        return resp

    async def _fetch(
        self,
        request: web.Request,
        rc: RouteCache,
        call: Call,
        key: CacheKey,
        directives: RequestDirectives,
        fetch: Fetch,
        timing: Timing,
        x_cache: str,
        vector: np.ndarray | None,
    ) -> Outcome:
        t0 = time.perf_counter()
        up = await fetch()
        timing.add("upstream", t0)
        kept = kept_headers(up.headers)
        storable = directives.store and response_storable(up.status, up.headers)
        shareable = response_shareable(up.status, up.headers)
        if up.body is not None or up.stream is None:
            entry = rc.entry(up.status, kept, body=up.body or b"", model=call.model, kind=call.kind)
            if storable:
                await rc.store(key, entry)
                await self._index_semantic(rc, call, key, vector, entry)
            return Outcome(entry=entry, shareable=shareable)
        return await self._tee(
            request, rc, call, key, up, kept, storable, shareable, timing, x_cache, vector
        )

    async def _tee(
        self,
        request: web.Request,
        rc: RouteCache,
        call: Call,
        key: CacheKey,
        up: UpstreamResponse,
        kept: list[tuple[str, str]],
        storable: bool,
        shareable: bool,
        timing: Timing,
        x_cache: str,
        vector: np.ndarray | None,
    ) -> Outcome:
        """Stream to the client as chunks arrive while keeping a copy; store it if it completed."""
        headers = CIMultiDict(downstream_headers(up.headers))
        headers["X-Cache"] = x_cache
        headers["Server-Timing"] = timing.header()
        resp = web.StreamResponse(status=up.status, reason=up.reason, headers=headers)
        sse = SSE in (up.header("Content-Type") or "")
        copy: bytearray | None = bytearray() if storable or shareable else None
        client_ok = True
        assert up.stream is not None
        stream = up.stream
        try:
            await resp.prepare(request)
            async for chunk in stream:
                if client_ok:
                    try:
                        await resp.write(chunk)
                    except ConnectionError:
                        client_ok = False  # keep reading: waiters and the store still want it
                if not client_ok and copy is None:
                    break  # nobody left to serve and nothing to store
                if copy is not None:
                    copy += chunk
                    if len(copy) > rc.max_entry_bytes:
                        copy, storable, shareable = None, False, False
            if client_ok:
                await resp.write_eof()
        except UpstreamError as exc:
            log.warning("upstream stream broke mid-way: %s", exc)
            if request.transport is not None:
                request.transport.close()
            return Outcome(error=BadGateway(f"upstream stream broke: {exc}"), response=resp)
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        if copy is None:
            return Outcome(response=resp, shareable=False)
        if sse:
            events = openai_sse.split_events(bytes(copy))
            if not openai_sse.completed(events):
                # An incomplete stream is never stored, and waiters get the failure, not half of it.
                return Outcome(
                    error=BadGateway("upstream stream ended before [DONE]"), response=resp
                )
            entry = rc.entry(up.status, kept, events=events, model=call.model, kind=call.kind)
        else:
            entry = rc.entry(up.status, kept, body=bytes(copy), model=call.model, kind=call.kind)
        if storable:
            await rc.store(key, entry)
            await self._index_semantic(rc, call, key, vector, entry)
        return Outcome(entry=entry, shareable=shareable, response=resp)

    async def _semantic_lookup(
        self,
        rc: RouteCache,
        call: Call,
        key: CacheKey,
        directives: RequestDirectives,
        timing: Timing,
        t: float,
        fetch: Fetch,
    ) -> tuple[web.Response | None, np.ndarray | None]:
        """After an exact miss: a verified near-duplicate's stored answer, in this namespace,
        and the call's vector (for the store after a miss)."""
        sr = self.semantic.get(rc.route)
        if sr is None or not sr.applies(call):
            return None, None
        found: dict[str, CacheEntry] = {}

        async def payload(exact_key: str) -> bool:
            got = await rc.tiers.lookup(exact_key)
            if got is not None and directives.acceptable(got[0].age()):
                found[exact_key] = got[0]
                return True
            return False

        vector = hit = None
        try:
            vector = await sr.embed(call)
            # issue 14 (error budget): search = lookup + the unserved candidate to label
            res = await sr.search(call, key.tenant_h, payload, vector)
            hit = res.hit
            call.extra["semantic_candidate"] = res.candidate
            if hit is not None and sr.should_audit(call, hit):
                sr.audit(call, hit, found[hit.exact_key], audit_fetch(fetch, call))
        except Exception:  # the cache boundary: a semantic failure is a miss, never an error
            log.exception("semantic lookup failed on route %s", rc.route)
        timing.add("semantic", t)
        if hit is None:
            return None, vector
        resp = render(found[hit.exact_key], framing_of(call), "semantic-hit", timing.header())
        if resp is not None:
            resp.headers["X-Cache-Similarity"] = f"{hit.similarity:.4f}"
            resp.headers["X-Cache-Score"] = f"{hit.score:.4f}"
            resp.headers["X-Cache-Entry"] = hit.exact_key
        return resp, vector

    async def _index_semantic(
        self,
        rc: RouteCache,
        call: Call,
        key: CacheKey,
        vector: np.ndarray | None,
        entry: CacheEntry,
    ) -> None:
        sr = self.semantic.get(rc.route)
        if sr is None:
            return
        try:
            await sr.remember(call, key.tenant_h, key.value, rc.policy.ttl, vector)
            cand = call.extra.get("semantic_candidate")  # issue 14: label the unserved candidate
            if cand is not None:
                sr.label_after_miss(call, cand, entry_loader(rc, cand.exact_key), entry)
        except Exception:  # the cache boundary: the response still goes out
            log.exception("semantic store failed on route %s", rc.route)
