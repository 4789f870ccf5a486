"""ModelInfer: parse, exact cache (key, lookup, single flight, store), dispatch, x-cache.

The key is the route's (cache/keys.py): model, then version, canonical input tensors, requested
outputs and parameters as key fields, and the tenant from the call metadata under the route's
`tenant_headers` (metadata keys are lowercase; names match case-insensitively, as HTTP headers
do). Only OK answers are stored. A hit is the stored reply with this call's id, and says so in
the initial metadata (`x-cache: hit`); misses say `miss`, calls that skip the lookup `bypass`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from multidict import CIMultiDict

from backends import UpstreamRequest
from cache.cache import RouteCache
from cache.keys import CacheKey
from cache.policy import RequestDirectives, request_directives
from gateway.grpc import codec
from gateway.grpc.calls import Context, Reply, grpc_route, metadata_of, parse, speaks_grpc
from gateway.grpc.proto import pb2
from gateway.grpc.status import RpcError, from_response

if TYPE_CHECKING:
    from gateway.grpc.service import InferenceService
    from gateway.routing import Route
    from gateway.runtime import Runtime


@dataclass(slots=True)
class _Outcome:
    """One backend call's result, as shared with single-flight waiters."""

    reply: bytes | None = None
    error: RpcError | None = None


def _shareable(outcome: _Outcome) -> bool:
    # A leader's deadline is its own: waiters with more time left call the backend themselves.
    return outcome.error is None or outcome.error.code != grpc.StatusCode.DEADLINE_EXCEEDED


class InferFlow:
    def __init__(self, service: InferenceService) -> None:
        self.service = service

    async def model_infer(self, request: bytes, ctx: Context, rt: Runtime) -> Reply:
        msg = parse(pb2.ModelInferRequest, request)
        if not msg.model_name:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, "model_name is required")
        route = grpc_route(rt, "ModelInfer", msg.model_name)
        tensors = codec.input_tensors(msg)
        metadata = metadata_of(ctx)
        raw = speaks_grpc(rt.backends[route.backend])

        async def fetch() -> bytes:
            if raw:
                return await self.service.forward(rt, route, "ModelInfer", request, ctx)
            return await self._via_http_v2(rt, route, msg, tensors, metadata, ctx)

        rc = self._route_cache(route)
        if rc is None:
            return await fetch(), route.name, "-"
        # Metadata keys are lowercase; tenant header names match case-insensitively.
        headers = CIMultiDict(metadata)
        directives = request_directives(headers.get("cache-control"), headers.get("pragma"))
        key = rc.key(msg.model_name, codec.key_fields(msg, tensors), headers)
        if directives.lookup:
            entry = rc.lookup_l1(key, directives)
            found = entry if entry is not None else await self._lookup(rc, key, directives)
            if found is not None and found.body is not None:
                await ctx.send_initial_metadata((("x-cache", "hit"),))
                return codec.with_id(found.body, msg.id), route.name, "hit"
        else:
            rc.bypass()
        x_cache = "miss" if directives.lookup else "bypass"
        await ctx.send_initial_metadata((("x-cache", x_cache),))
        if not directives.store:
            return await fetch(), route.name, x_cache

        async def compute() -> _Outcome:
            async with rc.lease(key) as peer:
                if peer is not None and peer.body is not None:
                    return _Outcome(reply=peer.body)
                try:
                    reply = await fetch()
                except RpcError as err:
                    return _Outcome(error=err)
                await rc.store(key, rc.entry(200, [], body=reply, model=msg.model_name,
                                             kind="grpc-infer"))  # fmt: skip
                return _Outcome(reply=reply)

        outcome, led = await rc.coalesce(key, compute, _shareable)
        if outcome.error is not None:
            raise outcome.error
        assert outcome.reply is not None
        reply = outcome.reply if led else codec.with_id(outcome.reply, msg.id)
        return reply, route.name, x_cache

    def _route_cache(self, route: Route) -> RouteCache | None:
        cache = self.service.state.cache
        if cache is None or not route.policy.exact.enabled:
            return None
        # Cache.routes is what a reload updates (build_app's swap_policies).
        return cache.routes.get(route.name)

    async def _lookup(self, rc: RouteCache, key: CacheKey, directives: RequestDirectives) -> Any:
        found = await rc.lookup(key, directives)
        return found[0] if found is not None else None

    async def _via_http_v2(
        self,
        rt: Runtime,
        route: Route,
        msg: Any,
        tensors: list[codec.Tensor],
        metadata: list[tuple[str, str]],
        ctx: Context,
    ) -> bytes:
        """Local engines and HTTP v2 upstreams: the same inference in the v2 binary form."""
        path, body, headers = codec.to_http_v2(msg, tensors)
        up = UpstreamRequest(
            "POST",
            path,
            [*metadata, *headers],
            body=body,
            deadline_s=ctx.time_remaining(),
            policy=route.upstream,
        )
        resp = await self.service.send(rt, route, up)
        data = await resp.read()
        if resp.status != 200:
            raise from_response(resp, data)
        try:
            return codec.from_http_v2(data, resp.header(codec.BINARY_HEADER), msg.id)
        except (ValueError, KeyError, TypeError) as exc:
            raise RpcError(
                grpc.StatusCode.INTERNAL, f"{route.backend} sent an unreadable v2 answer: {exc}"
            ) from None
