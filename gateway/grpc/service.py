"""`inference.GRPCInferenceService` on the gateway: routing, dispatch and the non-infer RPCs.

Every call reads the current runtime (routes and backends) and the current route caches, so a
config reload covers the gRPC listener as it covers HTTP; a call pins its runtime until it ends
so the reload's old backends close only after it. A backend that speaks gRPC (a pool of
`grpc://` replicas) gets the client's message bytes unparsed; any other backend (local engines,
HTTP v2 upstreams) gets the same call translated to HTTP v2 (gateway/grpc/codec.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
from prometheus_client import Counter, Histogram

from backends import BackendError, BadInput, UpstreamRequest, UpstreamResponse
from gateway.errors import GatewayError
from gateway.grpc import codec
from gateway.grpc.calls import (
    Context,
    Handler,
    Reply,
    grpc_route,
    metadata_of,
    parse,
    speaks_grpc,
)
from gateway.grpc.infer import InferFlow
from gateway.grpc.proto import PREFIX, SERVICE, pb2
from gateway.grpc.status import (
    RpcError,
    from_backend,
    from_gateway,
    from_response,
    read_answer,
)
from gateway.metrics import LATENCY_BUCKETS
from gateway.readiness import readiness
from gateway.routing import Route
from gateway.runtime import Runtime
from gateway.state import AppState

VERSION = "0.1.0"


class InferenceService:
    def __init__(self, state: AppState) -> None:
        self.state = state
        registry = state.metrics.registry
        self.requests = Counter(
            "latentgate_grpc_requests",
            "gRPC calls by route, method, status code and cache result (hit, miss, bypass, -)",
            ["route", "method", "code", "cache"],
            registry=registry,
        )
        self.latency = Histogram(
            "latentgate_grpc_request_duration_seconds",
            "gRPC call duration by method",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.infer = InferFlow(self)
        self.in_flight = 0

    def handler(self) -> grpc.GenericRpcHandler:
        rpcs: dict[str, Handler] = {
            "ServerLive": self._server_live,
            "ServerReady": self._server_ready,
            "ServerMetadata": self._server_metadata,
            "ModelReady": self._model_ready,
            "ModelMetadata": self._model_metadata,
            "ModelConfig": self._model_config,
            "ModelInfer": self.infer.model_infer,
        }
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                name: grpc.unary_unary_rpc_method_handler(self._wrap(name, fn))
                for name, fn in rpcs.items()
            },
        )

    def _wrap(self, method: str, fn: Handler) -> Callable[[bytes, Context], Awaitable[bytes]]:
        latency = self.latency.labels(method)

        async def call(request: bytes, context: Context) -> bytes:
            runtime = self.state.pipeline.runtime
            runtime.enter()
            self.in_flight += 1
            start = time.perf_counter()
            route, code, cache = "-", grpc.StatusCode.OK, "-"
            try:
                try:
                    reply, route, cache = await fn(request, context, runtime)
                    return reply
                except GatewayError as exc:
                    err = from_gateway(exc)
                except BadInput as exc:  # the shared v2 tensor codec's word for a bad request
                    err = from_backend(exc, "-")
                except RpcError as exc:
                    err = exc
                code = err.code
                await context.abort(err.code, err.message)
                raise AssertionError("abort returns only by raising")
            finally:
                self.requests.labels(route, method, code.name, cache).inc()
                latency.observe(time.perf_counter() - start)
                self.in_flight -= 1
                runtime.leave()

        return call

    # dispatch --------------------------------------------------------------------------------
    async def send(
        self, runtime: Runtime, route: Route, request: UpstreamRequest
    ) -> UpstreamResponse:
        backend = runtime.backends[route.backend]
        try:
            return await backend.send(request)
        except BackendError as exc:
            raise from_backend(exc, route.backend) from None
        except GatewayError as exc:
            raise from_gateway(exc) from None

    async def read_answer(self, resp: UpstreamResponse, route: Route) -> bytes:
        """An HTTP v2 backend's answer, whole but capped (gateway/grpc/status.read_answer)."""
        return await read_answer(resp, route.backend, self.state.settings.limits.max_body_bytes)

    async def forward(
        self, runtime: Runtime, route: Route, method: str, request: bytes, context: Context
    ) -> bytes:
        """The client's message, unparsed, to a gRPC pool (balancing, retries, hedging)."""
        up = UpstreamRequest(
            "POST",
            PREFIX + method,
            metadata_of(context),
            body=request,
            deadline_s=context.time_remaining(),
            policy=route.upstream,
        )
        resp = await self.send(runtime, route, up)
        body = await resp.read()
        if resp.status != 200 and not (resp.status == 503 and method.endswith("Ready")):
            raise from_response(resp, body)
        return body

    async def http_v2(
        self, runtime: Runtime, route: Route, method: str, path: str, context: Context
    ) -> tuple[int, Any]:
        """A GET on the backend's HTTP v2 API: (status, JSON document)."""
        up = UpstreamRequest(
            method, path, metadata_of(context), deadline_s=context.time_remaining()
        )
        resp = await self.send(runtime, route, up)
        body = await self.read_answer(resp, route)
        if resp.status not in (200, 503):
            raise from_response(resp, body)
        try:
            return resp.status, json.loads(body) if body else {}
        except ValueError:
            raise RpcError(grpc.StatusCode.INTERNAL, f"{route.backend}: bad v2 JSON") from None

    # server RPCs -----------------------------------------------------------------------------
    async def _server_live(self, _: bytes, ctx: Context, rt: Runtime) -> Reply:
        return pb2.ServerLiveResponse(live=True).SerializeToString(), "-", "-"

    async def _server_ready(self, _: bytes, ctx: Context, rt: Runtime) -> Reply:
        """The gateway's readiness, as /readyz and /v2/health/ready (gateway/readiness.py): its
        own parts loaded, not draining, and the backends in `readiness.require` reachable."""
        ready, _body = await readiness(self.state)
        return pb2.ServerReadyResponse(ready=ready).SerializeToString(), "-", "-"

    async def _server_metadata(self, _: bytes, ctx: Context, rt: Runtime) -> Reply:
        msg = pb2.ServerMetadataResponse(name="latentgate", version=VERSION, extensions=[])
        return msg.SerializeToString(), "-", "-"

    # model RPCs ------------------------------------------------------------------------------
    async def _model_ready(self, request: bytes, ctx: Context, rt: Runtime) -> Reply:
        msg = parse(pb2.ModelReadyRequest, request)
        route = grpc_route(rt, "ModelReady", msg.name)
        if speaks_grpc(rt.backends[route.backend]):
            return await self.forward(rt, route, "ModelReady", request, ctx), route.name, "-"
        status, _ = await self.http_v2(rt, route, "GET", _model_path(msg) + "/ready", ctx)
        return pb2.ModelReadyResponse(ready=status == 200).SerializeToString(), route.name, "-"

    async def _model_metadata(self, request: bytes, ctx: Context, rt: Runtime) -> Reply:
        msg = parse(pb2.ModelMetadataRequest, request)
        route = grpc_route(rt, "ModelMetadata", msg.name)
        if speaks_grpc(rt.backends[route.backend]):
            return await self.forward(rt, route, "ModelMetadata", request, ctx), route.name, "-"
        return codec.metadata_from_json(await self._metadata(rt, route, msg, ctx)), route.name, "-"

    async def _model_config(self, request: bytes, ctx: Context, rt: Runtime) -> Reply:
        msg = parse(pb2.ModelConfigRequest, request)
        route = grpc_route(rt, "ModelConfig", msg.name)
        backend = rt.backends[route.backend]
        if speaks_grpc(backend):
            return await self.forward(rt, route, "ModelConfig", request, ctx), route.name, "-"
        info = backend.describe()
        if info.get("kind") not in ("onnxruntime", "tensorrt"):
            raise RpcError(
                grpc.StatusCode.UNIMPLEMENTED,
                f"ModelConfig is served for local and gRPC backends; {route.backend} is neither",
            )
        batching = info.get("batching")
        delay = batching.get("max_delay_ms") if isinstance(batching, dict) else None
        doc = await self._metadata(rt, route, msg, ctx)
        return codec.config_from_json(doc, delay), route.name, "-"

    async def _metadata(self, rt: Runtime, route: Route, msg: Any, ctx: Context) -> Any:
        status, doc = await self.http_v2(rt, route, "GET", _model_path(msg), ctx)
        if status != 200 or not isinstance(doc, dict):
            raise RpcError(grpc.StatusCode.UNAVAILABLE, f"model {msg.name} is not ready")
        return doc


def _model_path(msg: Any) -> str:
    return codec.model_path(msg.name, msg.version)
