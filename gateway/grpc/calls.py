"""What every gRPC handler shares: the context type, call metadata, route lookup, parsing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from backends import Backend
from gateway.grpc.proto import PREFIX
from gateway.grpc.status import RpcError
from gateway.routing import Match, Route
from gateway.runtime import Runtime

Context: TypeAlias = "grpc.aio.ServicerContext[bytes, bytes]"
# A handler answers (reply, route name, x-cache result) or raises RpcError.
Reply = tuple[bytes, str, str]
Handler = Callable[[bytes, Context, Runtime], Awaitable[Reply]]
Metadata = list[tuple[str, str]]


def metadata_of(context: Context) -> Metadata:
    """The call's text metadata; binary (-bin) entries are not forwarded."""
    return [(k, v) for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)]


def grpc_route(runtime: Runtime, method: str, model: str) -> Route:
    """The first `protocol: grpc` route whose path matches the method and whose model fits
    (HTTP routes are never candidates, wherever they sit in the list)."""
    path = PREFIX + method
    for route in runtime.router.routes:
        if route.protocol != "grpc" or route.matches("POST", path) is Match.NONE:
            continue
        if route.model is None or route.model == model:
            return route
    raise RpcError(grpc.StatusCode.NOT_FOUND, f"no gRPC route for model {model!r}")


def speaks_grpc(backend: Backend) -> bool:
    return getattr(backend, "wire", "http") == "grpc"


def parse(message: Any, data: bytes) -> Any:
    try:
        return message.FromString(data)
    except DecodeError as exc:
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"undecodable message: {exc}") from None
