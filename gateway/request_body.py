"""A request's body as the pipeline takes it: read whole for a route that reads it, or streamed
to the replica as it arrives; decoded from its Content-Encoding either way (gateway.codings)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from backends import RequestBodyError
from gateway.codings import body_decoder, read_coded, undecodable
from gateway.config import LimitSettings
from gateway.errors import BadRequest, PayloadTooLarge, RequestTimeout


async def read(request: web.Request, limits: LimitSettings) -> bytes:
    """The whole body of a request whose route reads it (a key, a parse): decoded, within
    limits.max_body_bytes and limits.body_read_timeout_s, or the JSON 4xx that says why."""
    limit = limits.max_body_bytes
    content = request.content
    decoder = body_decoder(request, limit)
    try:
        if decoder is not None:
            async with asyncio.timeout(limits.body_read_timeout_s):
                return await read_coded(request, decoder)
        if content.is_eof():
            # The whole body came with the headers (the usual small POST): nothing to wait
            # for, so it is taken as it lies in the buffer (no read loop, no bytearray copy).
            body = content.read_nowait()
            if len(body) > limit:
                raise PayloadTooLarge(f"request body exceeds {limit} bytes")
        else:
            async with asyncio.timeout(limits.body_read_timeout_s):
                body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge(f"request body exceeds {limit} bytes") from None
    except TimeoutError:
        raise RequestTimeout("the request body did not arrive in time") from None
    except RequestPayloadError as exc:
        raise undecodable(request) from exc
    return body


async def stream(request: web.Request, limits: LimitSettings) -> AsyncIterator[bytes]:
    """The client's body as the transport forwards it, decoded as it arrives. Its failures
    are the request's, not the replica's (RequestBodyError: a 413/400 for the client, no
    mark on the replica); one found at the end (a coded stream cut short) fails the upstream
    call before its body is complete, so the replica never takes it as a request."""
    limit = limits.max_body_bytes
    decoder = body_decoder(request, limit)
    seen = 0
    # the whole body within body_read_timeout_s, as read() has it: the route's `total` is not
    # checked while the body goes out, so a client stalled mid-body held the replica's connection
    deadline = asyncio.get_running_loop().time() + limits.body_read_timeout_s
    try:
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    chunk = await request.content.readany()
            except TimeoutError:
                raise RequestTimeout("the request body did not arrive in time") from None
            if not chunk:
                break
            seen += len(chunk)
            if seen > limit:
                raise PayloadTooLarge(f"request body exceeds {limit} bytes")
            if decoder is None:
                yield chunk
            elif out := decoder.feed(chunk):
                yield out
        if decoder is not None:
            decoder.finish()
    except RequestPayloadError as exc:
        raise RequestBodyError(undecodable(request)) from exc
    except (PayloadTooLarge, BadRequest, RequestTimeout) as exc:
        raise RequestBodyError(exc) from None
