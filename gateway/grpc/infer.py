"""ModelInfer: parse, the route's cached flow (cache/flow.py), dispatch, x-cache.

The key is the route's (cache/keys.py): model, then version, canonical input tensors, requested
outputs and parameters as key fields, and the tenant from the call metadata under the route's
`tenant_headers` (metadata keys are lowercase; names match case-insensitively, as HTTP headers
do). Lookup, single flight, the Redis lease and the store are the flow's, as on HTTP routes;
only OK replies are stored. A reply served from an entry (a hit, or a flight's shared answer)
gets this call's id; the initial metadata says `x-cache: hit`, `miss` or `bypass`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from multidict import CIMultiDict

from backends import UpstreamRequest, UpstreamResponse
from cache import Ask, CacheEntry, Hit, NotCached, request_directives
from gateway.grpc import codec
from gateway.grpc.calls import Context, Reply, grpc_route, metadata_of, parse, speaks_grpc
from gateway.grpc.codec import params_of
from gateway.grpc.proto import pb2
from gateway.grpc.status import RpcError, from_response
from gateway.headers import HOP_BY_HOP, field
from gateway.protocols.v2 import in_sequence

if TYPE_CHECKING:
    from gateway.grpc.service import InferenceService
    from gateway.routing import Route
    from gateway.runtime import Runtime

KIND = "grpc-infer"


@dataclass(slots=True)
class _Call:
    """What the flow reads of a call (cache.flow's CallLike); tensors have no semantic text."""

    model: str | None
    deterministic: bool = True
    greedy: bool = True
    semantic_text: str | None = None
    context: Any = None


class _Answers:
    """An entry answers a gRPC call when it is a stored OK reply (no streams on this RPC)."""

    def serves(self, entry: CacheEntry) -> bool:
        return entry.status == 200 and entry.body is not None

    def keeps(self, content_type: str) -> bool:
        return True  # (the reply the edge made of the backend's answer, checked as it was made)

    def follows_stream(self, leader: object) -> bool:
        return False  # (no semantic text: never joins a flight)

    def takes_stream(self, leader: object) -> bool:
        return False  # (no streams on this RPC)

    def seal(self, content_type: str, data: bytes) -> bytes | list[bytes] | None:
        return data


class _NoClock:
    """The flow records stage times; the gRPC edge has no Server-Timing to put them in."""

    def add(self, name: str, since: float) -> float:
        return time.perf_counter()


# Messages past this size are converted and keyed in a worker thread.
_INLINE_BYTES = 256 << 10
_R = TypeVar("_R")


async def _maybe_thread(big: bool, fn: Callable[..., _R], *args: Any) -> _R:
    return await asyncio.to_thread(fn, *args) if big else fn(*args)


_ANSWERS = _Answers()
_CLOCK = _NoClock()
# Headers that describe the translated body, which the gateway writes: call metadata under these
# names describes the gRPC message (or nothing) and, first in the list, would be read instead.
# accept-encoding: the translated answer is parsed as it arrives (the transport does not
# decode), so only identity is asked for, whatever the client's metadata says.
_TRANSLATION_OWNS = HOP_BY_HOP | {
    "content-type",
    "content-length",
    "content-encoding",
    "host",
    "accept-encoding",
}


class InferFlow:
    def __init__(self, service: InferenceService) -> None:
        self.service = service

    async def model_infer(self, request: bytes, ctx: Context, rt: Runtime) -> Reply:
        msg = parse(pb2.ModelInferRequest, request)
        if not msg.model_name:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, "model_name is required")
        route = grpc_route(rt, "ModelInfer", msg.model_name)
        for what, items in (("inputs", msg.inputs), ("outputs", msg.outputs)):
            if len(items) > route.max_items:  # as over HTTP (a 413 there): gateway/protocols/v2
                raise RpcError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the request names {len(items)} {what}; this route takes at most "
                    f"{route.max_items} per request",
                )
        # Megabytes of tensors take 10s to 100s of ms to convert and hash: off the event loop,
        # so health checks and other calls are answered meanwhile (as HTTP's parse is).
        big = len(request) > _INLINE_BYTES
        tensors = await _maybe_thread(big, codec.input_tensors, msg)
        for t in tensors:  # the route's rows-per-request limit, as over HTTP (a 413 there)
            if t.shape and t.shape[0] > route.max_items:
                raise RpcError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"input '{t.name}' has {t.shape[0]} items; this route takes at most "
                    f"{route.max_items} per request",
                )
        metadata = metadata_of(ctx)
        raw = speaks_grpc(rt.backends[route.backend])

        async def fetch() -> bytes:
            if raw:
                return await self.service.forward(rt, route, "ModelInfer", request, ctx)
            return await self._via_http_v2(rt, route, msg, tensors, metadata, ctx)

        # The pinned generation's route cache: its key and policy are the route's own.
        flow = rt.flows.get(route.name)
        if flow is None:
            return await fetch(), route.name, "-"
        headers = CIMultiDict(metadata)
        fields = await _maybe_thread(big, codec.key_fields, msg, tensors)
        ask = Ask(
            key=await _maybe_thread(big, flow.key, msg.model_name, fields, headers),
            directives=request_directives(
                field(headers, "cache-control"), field(headers, "pragma")
            ),
            call=_Call(msg.model_name, deterministic=not in_sequence(params_of(msg.parameters))),
            kind=KIND,
            answers=_ANSWERS,
            clock=_CLOCK,
        )

        async def compute() -> UpstreamResponse:
            return UpstreamResponse(200, "OK", [], body=await fetch())

        try:
            result = await flow.run(ask, compute)
        except NotCached as exc:  # only-if-cached: HTTP's 504, which gRPC spells UNAVAILABLE
            raise RpcError(grpc.StatusCode.UNAVAILABLE, str(exc)) from None
        if isinstance(result, Hit):
            assert result.entry.body is not None
            reply = codec.with_id(result.entry.body, msg.id)
        else:
            assert result.response.body is not None
            reply = result.response.body
        await ctx.send_initial_metadata((("x-cache", result.x_cache),))
        return reply, route.name, result.x_cache

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
        owned = _TRANSLATION_OWNS | {k.lower() for k, _ in headers}
        up = UpstreamRequest(
            "POST",
            path,
            [
                *((k, v) for k, v in metadata if k.lower() not in owned),
                *headers,
                ("accept-encoding", "identity"),
            ],
            body=body,
            deadline_s=ctx.time_remaining(),
            policy=route.upstream,
        )
        resp = await self.service.send(rt, route, up)
        data = await self.service.read_answer(resp, route)
        if resp.status != 200:
            raise from_response(resp, data)
        try:
            return codec.from_http_v2(data, resp.header(codec.BINARY_HEADER), msg.id)
        except (ValueError, KeyError, TypeError) as exc:
            raise RpcError(
                grpc.StatusCode.INTERNAL, f"{route.backend} sent an unreadable v2 answer: {exc}"
            ) from None
