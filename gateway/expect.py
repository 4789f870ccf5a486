"""`Expect` on the model routes. `100-continue` is answered as aiohttp does (an interim 100,
then the request goes on); any other expectation is the 417 RFC 9110 10.1.1 asks for, as the
gateway's own JSON error in the envelope of the route the path resolves to. (aiohttp's own 417
is text/plain, which no OpenAI, Anthropic or v2 client parses as an error.)"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import HttpVersion11, web
from aiohttp.web_urldispatcher import _default_expect_handler

from gateway.errors import ExpectationFailed
from gateway.responses import error
from gateway.routing import Router
from gateway.timing import Timing

ExpectHandler = Callable[[web.Request], Awaitable[web.StreamResponse | None]]


def expect_handler(router: Callable[[], Router]) -> ExpectHandler:
    """router: the current routes (a reload swaps them), read per request."""

    async def handle(request: web.Request) -> web.StreamResponse | None:
        expect = request.headers.get("Expect", "")
        if request.version != HttpVersion11 or expect.strip().lower() == "100-continue":
            await _default_expect_handler(request)  # (HTTP/1.0 has no Expect: ignored)
            return None
        candidates, _ = router().resolve(request.method, request.path)
        protocol = candidates[0].protocol if candidates else "passthrough"
        err = ExpectationFailed(f"Expect: {expect!r} is not supported; only 100-continue is")
        return error(protocol, err, Timing())

    return handle
