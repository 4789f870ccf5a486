"""Downstream connection guard: a per-client-IP connection cap, a deadline for the first
request's headers (slowloris), JSON bodies for what aiohttp refuses itself, and no lingering on a
compressed body left unread, plugged into aiohttp's connection manager; nothing else here.

Idle keep-alive connections (and a stalled later request) are closed by aiohttp's keep-alive timer,
which `limits.client_idle_timeout_s` sets.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import json
import logging
from collections import Counter as Tally
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMethod, LineTooLong
from aiohttp.typedefs import Handler
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse
from aiohttp.web_server import Server
from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.config import LimitSettings
from gateway.headers import SERVER

log = logging.getLogger("latentgate.connections")


def _error_json(status: int, reason: str, message: str) -> bytes:
    error = {
        "message": message,
        "type": reason.lower().replace(" ", "_"),
        "param": None,
        "code": status,
    }
    return json.dumps({"error": error}).encode()


def _response(status: int, reason: str, message: str) -> bytes:
    body = _error_json(status, reason, message)
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def _loopback(host: str) -> bool:
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(addr, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return addr.is_loopback or (mapped is not None and mapped.is_loopback)


class ConnectionGuard:
    """Policy and metrics shared by every listener of one worker."""

    def __init__(self, limits: LimitSettings, registry: CollectorRegistry) -> None:
        self.max_per_client = limits.max_connections_per_client
        self.cap_loopback = limits.cap_loopback_clients
        self.header_timeout_s = limits.header_timeout_s
        self.open = Gauge(
            "latentgate_downstream_connections", "Open downstream connections", registry=registry
        )
        self.refused = Counter(
            "latentgate_downstream_connections_refused",
            "Downstream connections closed by the gateway: per_client_cap, header_timeout",
            ["reason"],
            registry=registry,
        )
        for reason in ("per_client_cap", "header_timeout"):
            self.refused.labels(reason)


class JsonErrorHandler(RequestHandler):
    """aiohttp answers a request it could not parse (its request line, a header, the chunked
    framing) or a handler that raised, itself, in text/plain; a client of this gateway gets the
    JSON error body every other error has, whatever stage refused it."""

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> StreamResponse:
        # the parser's message is its first line ("Invalid header token:"), then the bytes
        said = (message or "").split("\n", 1)[0].strip().rstrip(":")
        if isinstance(exc, LineTooLong):  # its message quotes the line back
            said = "a request line or header field is too long"
        retry_after: dict[str, str] = {}
        if status < 500 and request.writer.output_size == 0:
            # The client's own mistake (its request line, a header, the chunked framing): one
            # line, not aiohttp's ERROR with a traceback for every request a client gets wrong
            # (debug for a first line that is no HTTP method: TLS or a scanner on the port).
            level = logging.DEBUG if isinstance(exc, BadHttpMethod) else logging.INFO
            log.log(
                level, "refused a malformed request from %s: %s (%d)", request.remote, said, status
            )
        else:
            plain = super().handle_error(request, status, exc, message)  # logs; raises if sent
            retry_after = {k: v for k, v in plain.headers.items() if k.lower() == "retry-after"}
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = "Error"
        text = said if status < 500 and said else reason
        resp = web.Response(
            status=status,
            body=_error_json(status, reason, text),
            content_type="application/json",
            headers=retry_after,
        )
        resp.force_close()
        return resp

    async def finish_response(
        self, request: BaseRequest, resp: StreamResponse, start_time: float | None
    ) -> tuple[StreamResponse, bool]:
        out = await super().finish_response(request, resp, start_time)
        if _coded_body_left(request):
            # Answered (a 413, a 400...) with a compressed body still coming: aiohttp would
            # linger up to 10 s reading the rest (and under a runner that decodes bodies, inflate
            # it on the event loop: a small gzip bomb is gigabytes that stall every client).
            # A refused or broken coded body has no request behind it worth that wait: closed
            # instead, now that the answer is written. A plain body keeps lingering, so a
            # client still sending it reads its answer rather than a reset.
            self.force_close()
        return out


def _coded_body_left(request: BaseRequest) -> bool:
    """A request body in a Content-Encoding (not identity) that was not read to its end."""
    coding = request.headers.get("Content-Encoding", "").strip(" \t").lower()
    return coding not in ("", "identity") and not request.content.is_eof()


class GuardedServer(Server):
    """aiohttp's connection manager plus the guard's accounting for each connection."""

    def __init__(self, *args: Any, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._guard = guard
        self._per_client: Tally[str] = Tally()
        self._client_of: dict[RequestHandler, str | None] = {}
        self._deadlines: dict[RequestHandler, asyncio.TimerHandle] = {}

    def __call__(self) -> RequestHandler:
        return JsonErrorHandler(self, loop=self._loop, **self._kwargs)

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        guard = self._guard
        guard.open.inc()
        peer = transport.get_extra_info("peername")
        # Unix-socket and (by default) loopback peers are local processes: the cap is about
        # remote clients. A sidecar's application talks over loopback with a pool of its own.
        client = peer[0] if isinstance(peer, tuple) and peer else None
        if client is not None and not guard.cap_loopback and _loopback(client):
            client = None
        self._client_of[handler] = client
        if client is not None:
            self._per_client[client] += 1
            if self._per_client[client] > guard.max_per_client:
                guard.refused.labels("per_client_cap").inc()
                log.warning(
                    "refusing a connection from %s: %d open (cap %d)",
                    client,
                    self._per_client[client] - 1,
                    guard.max_per_client,
                )
                transport.write(
                    _response(503, "Service Unavailable", "too many connections from this client")
                )
                transport.close()
                return
        self._deadlines[handler] = asyncio.get_running_loop().call_later(
            guard.header_timeout_s, self._header_deadline, handler, transport
        )

    def _header_deadline(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        self._deadlines.pop(handler, None)
        # `_request_count` counts requests whose headers were parsed on this connection.
        if getattr(handler, "_request_count", 1) == 0 and not transport.is_closing():
            self._guard.refused.labels("header_timeout").inc()
            transport.write(
                _response(408, "Request Timeout", "request headers did not arrive in time")
            )
            transport.close()

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        timer = self._deadlines.pop(handler, None)
        if timer is not None:
            timer.cancel()
        if handler in self._client_of:
            self._guard.open.dec()
            client = self._client_of.pop(handler)
            if client is not None:
                self._per_client[client] -= 1
                if self._per_client[client] <= 0:
                    del self._per_client[client]


class NamedRequest(web.Request):
    """A request whose responses say `Server: latentgate` (gateway.headers.SERVER says why).
    The app's on_response_prepare hook does it for what goes through the router, but aiohttp
    runs that hook through `match_info`, which the model-traffic fast path (gateway.dispatch)
    never sets: its misses, hits and errors still said `Python/3.11 aiohttp/3.x.y`."""

    async def _prepare_hook(self, response: web.StreamResponse) -> None:
        response.headers["Server"] = SERVER
        await super()._prepare_hook(response)


_LAST_WAIT_S = 0.01  # aiohttp's shutdown wait when the grace is spent (0 would be unbounded)


class GuardedAppRunner(web.AppRunner):
    """AppRunner whose connection manager is a GuardedServer (with `handler` instead of the
    app's own, when given)."""

    def __init__(
        self,
        app: web.Application,
        *,
        guard: ConnectionGuard,
        handler: Handler | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(app, **kwargs)
        self._guard = guard
        self._handler = handler

    def shutdown_within(self, seconds: float) -> None:
        """Bound aiohttp's own shutdown (runner.cleanup) by what is left of the drain's grace.
        It waits for a connection's handler twice, before and after it cancels the request,
        so each wait gets half; and never 0, which it takes as no bound at all. Before, a
        stream still going when the grace ran out went on for two more graces (the process
        outlived a terminationGracePeriodSeconds sized by the docs), and forever with a grace
        of 0."""
        self._shutdown_timeout = max(seconds / 2, _LAST_WAIT_S)

    async def _make_server(self) -> Server:
        plain = await super()._make_server()
        return GuardedServer(
            self._handler or plain.request_handler,
            request_factory=functools.partial(self._app._make_request, _cls=NamedRequest),
            handler_cancellation=plain.handler_cancellation,
            loop=plain._loop,
            guard=self._guard,
            **plain._kwargs,
        )
