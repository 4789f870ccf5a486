"""`Expect` on the model routes. `100-continue` is answered as aiohttp does (an interim 100,
then the request goes on), unless the declared body is over `limits.max_body_bytes`: then the
413 the request would get comes instead of the 100 (RFC 9110 10.1.1), so the client never sends
the body it asked leave to send. Any other expectation is the 417 RFC 9110 10.1.1 asks for. Both
are the gateway's own JSON error in the envelope of the route the path resolves to (aiohttp's
own 417 is text/plain, which no OpenAI, Anthropic or v2 client parses as an error)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import HttpVersion11, web
from aiohttp.web_urldispatcher import _default_expect_handler

from gateway.config import LimitSettings
from gateway.errors import ExpectationFailed, GatewayError, PayloadTooLarge
from gateway.middleware.listener_roles import ROLES, refusal
from gateway.responses import error
from gateway.routing import Router
from gateway.timing import Timing

ExpectHandler = Callable[[web.Request], Awaitable[web.StreamResponse | None]]


def expect_handler(router: Callable[[], Router], limits: LimitSettings) -> ExpectHandler:
    """router: the current routes (a reload swaps them), read per request."""

    async def refuse(request: web.Request, err: GatewayError) -> web.StreamResponse:
        candidates, _ = router().resolve(request.method, request.path)
        protocol = candidates[0].protocol if candidates else "passthrough"
        return await _final(request, error(protocol, err, Timing()))

    async def handle(request: web.Request) -> web.StreamResponse | None:
        expect = request.headers.get("Expect", "")
        if request.version != HttpVersion11:
            return None  # (HTTP/1.0 has no Expect: ignored)
        roles = request.app.get(ROLES)
        # The listener split's 404 (a model path on the admin listener) came only after this,
        # which aiohttp runs before the middlewares, had answered 100, 413 or 417 there.
        refused = refusal(request) if roles is not None and roles.admin else None
        if refused is not None:
            return await _final(request, refused)
        if expect.strip().lower() == "100-continue":
            length = request.content_length
            if length is not None and length > limits.max_body_bytes:
                too_large = f"request body of {length} bytes exceeds {limits.max_body_bytes}"
                return await refuse(request, PayloadTooLarge(too_large))
            await _default_expect_handler(request)
            return None
        return await refuse(
            request, ExpectationFailed(f"Expect: {expect!r} is not supported; only 100-continue is")
        )

    return handle


async def _final(request: web.Request, response: web.Response) -> web.StreamResponse:
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    # A client that waits for the 100 before it sends its body now never sends it: aiohttp
    # would hold the connection for its lingering time (10 s) reading a body that is not
    # coming. The answer is written; the close sends it before it ends the connection.
    # One that sent its body anyway is left to aiohttp's lingering read: closing on body
    # bytes not read would reset the connection, and the client could lose the answer.
    if request.protocol is not None and request.content.total_bytes == 0:
        request.protocol.force_close()
    return response
