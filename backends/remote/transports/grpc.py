"""gRPC transport: one persistent grpc.aio channel per replica, unary calls as opaque bytes.

The pool's policy layers (balancer, retries, hedging, outlier ejection, breaker) sit above this
unchanged: an `UpstreamRequest` names the method in `path_qs` (`/package.Service/Method`), carries
the serialized request message as its body and the call metadata as its headers. Nothing here
parses a message, so a pass-through call costs no protobuf decode or re-encode.

Status mapping at this boundary: UNAVAILABLE (refused, reset, replica gone) is an
UpstreamConnectError, retryable like a refused HTTP connection; DEADLINE_EXCEEDED is an
UpstreamTimeout; a reply over the transport's `answer_cap` (the gateway's limits.max_body_bytes)
is refused by grpcio from its length prefix, before it is held, and is AnswerTooLarge; any other
non-OK status becomes a response whose HTTP-like status drives the
pool (5xx counts against the replica) and whose `grpc-status` / `grpc-message` headers let the
gateway answer the client with the upstream's own code and message.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import grpc.aio

from backends.base import GRPC_MESSAGE_HEADER, GRPC_STATUS_HEADER, UpstreamRequest, UpstreamResponse
from backends.errors import (
    AnswerTooLarge,
    UpstreamConnectError,
    UpstreamProtocolError,
    UpstreamTimeout,
)
from backends.remote.retry import PUSHBACK_HEADER
from backends.settings import ANSWER_CAP, PoolLimits, Timeouts

# gRPC code → the HTTP status the pool reasons with (retry on_status, outlier 5xx counting).
HTTP_OF_CODE: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
# What grpcio's own refusal of a message over max_receive_message_length says (grpc core's
# "Received message larger than max (N vs. M)"); the replica's own RESOURCE_EXHAUSTED does not.
_OVER_CAP = "Received message larger than max"
# Set by the peer's HTTP/2 layer, or the channel's own: never forwarded as call metadata.
_NOT_FORWARDED = frozenset(
    {
        ":authority",
        "content-type",
        "te",
        "user-agent",
        "grpc-timeout",
        "grpc-encoding",
        "grpc-accept-encoding",
        "host",
        "connection",
        "content-length",
    }
)


def target_of(url: str) -> str:
    """`grpc://host:port` → `host:port`; `grpc+unix:/path` → `unix:/path` (grpc's own forms)."""
    if url.startswith("grpc+unix:"):
        return "unix:" + url[len("grpc+unix:") :]
    return url.removeprefix("grpc://").rstrip("/")


def call_metadata(headers: list[tuple[str, str]]) -> tuple[tuple[str, Any], ...]:
    return tuple((k.lower(), v) for k, v in headers if k.lower() not in _NOT_FORWARDED)


class GrpcTransport:
    """Persistent HTTP/2 to one replica: `grpc://host:port` or `grpc+unix:/path`."""

    def __init__(
        self, url: str, limits: PoolLimits, timeouts: Timeouts, answer_cap: int = ANSWER_CAP
    ) -> None:
        self.url = url
        self._target = target_of(url)
        self._limits = limits
        self._timeouts = timeouts
        self._answer_cap = answer_cap
        self._closed = False
        # Created on first use: a grpc.aio channel belongs to the event loop that made it.
        self._channel: grpc.aio.Channel | None = None
        self._methods: dict[str, grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]] = {}
        self.in_flight = 0

    def _open(self) -> grpc.aio.Channel:
        if self._channel is None:
            keepalive_ms = int(self._limits.keepalive_s * 1000)
            self._channel = grpc.aio.insecure_channel(
                self._target,
                options=[
                    # a reply is received whole: a replica must not make the gateway hold more
                    ("grpc.max_receive_message_length", self._answer_cap),
                    ("grpc.max_send_message_length", -1),
                    ("grpc.keepalive_time_ms", keepalive_ms),
                    ("grpc.keepalive_permit_without_calls", 0),
                    ("grpc.initial_reconnect_backoff_ms", 100),
                    ("grpc.max_reconnect_backoff_ms", 1000),
                    # The pool balances over replicas: one subchannel per channel is enough.
                    ("grpc.use_local_subchannel_pool", 1),
                ],
            )
        return self._channel

    def _method(self, path: str) -> grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]:
        mc = self._methods.get(path)
        if mc is None:
            # No serializers: request and response stay bytes.
            mc = self._open().unary_unary(path)
            self._methods[path] = mc
        return mc

    async def send(
        self,
        request: UpstreamRequest,
        *,
        connect_s: float | None = None,
        deadline_s: float | None = None,
    ) -> UpstreamResponse:
        body = request.body if isinstance(request.body, bytes) else b""
        if request.body is not None and not isinstance(request.body, bytes):
            raise UpstreamProtocolError("a gRPC call needs its whole message", self.url)
        deadline = deadline_s if deadline_s is not None else request.deadline_s
        timeout = deadline if deadline is not None else self._timeouts.total
        path = request.path_qs
        self.in_flight += 1
        try:
            # The deadline travels upstream as grpc-timeout: replicas can shed late work.
            reply: bytes = await self._method(path)(
                body, timeout=max(0.001, timeout), metadata=call_metadata(request.headers)
            )
        except grpc.aio.AioRpcError as exc:
            return self._failed(exc)
        except asyncio.InvalidStateError as exc:  # the channel was closed under the call
            raise UpstreamConnectError(f"{self.url}: channel closed", self.url) from exc
        finally:
            self.in_flight -= 1
        status = 200
        # ServerReady / ModelReady answer OK with `ready: false` when not ready; proto3 does not
        # encode a false bool, so an empty reply is "not ready" (health checks read the status).
        if not reply and path.endswith("Ready"):
            status = 503
        return UpstreamResponse(status, "OK", [], body=reply, replica=self.url)

    def _failed(self, exc: grpc.aio.AioRpcError) -> UpstreamResponse:
        code = exc.code()
        details = exc.details() or code.name
        pushback = _pushback(exc)
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and _OVER_CAP in details:
            raise AnswerTooLarge(self.url, self._answer_cap) from exc
        if code == grpc.StatusCode.UNAVAILABLE:
            raise UpstreamConnectError(
                f"{self.url} unavailable: {details}", self.url, pushback
            ) from exc
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise UpstreamTimeout(f"{self.url} did not answer in time", self.url) from exc
        headers = [(GRPC_STATUS_HEADER, str(code.value[0])), (GRPC_MESSAGE_HEADER, details)]
        if pushback is not None:
            headers.append((PUSHBACK_HEADER, pushback))
        return UpstreamResponse(
            HTTP_OF_CODE.get(code, 500), code.name, headers, body=b"", replica=self.url
        )

    def connections_in_use(self) -> int:
        # HTTP/2 multiplexes one connection: the breaker's connection limit bounds streams here.
        return self.in_flight

    def pool_stats(self) -> dict[str, int]:
        return {
            "idle": 1 if self._channel is not None and not self.in_flight else 0,
            "in_use": self.in_flight,
            "limit": self._limits.max_connections,
        }

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        self._closed = True
        if self._channel is not None:
            channel, self._channel = self._channel, None
            self._methods.clear()
            await channel.close()


def _pushback(exc: grpc.aio.AioRpcError) -> str | None:
    """The replica's grpc-retry-pushback-ms trailer (gRFC A6), as sent; None without one."""
    for key, value in exc.trailing_metadata() or ():
        if key == PUSHBACK_HEADER:
            return value.decode("latin-1") if isinstance(value, bytes) else str(value)
    return None
