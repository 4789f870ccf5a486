"""Local engine work for a client that may hang up: cancelled when its connection closes."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from aiohttp import web

from backends import UpstreamResponse
from gateway.errors import ClientClosed

_CLIENT_CHECK_S = 0.05  # how often local engine work looks whether its client is still there


async def unless_client_left(
    work: Coroutine[Any, Any, UpstreamResponse], client: web.Request
) -> UpstreamResponse:
    """Local engine work for a client that may hang up: aiohttp does not cancel a handler when
    its client goes, and queued engine work (thousands of texts) would run to the end and stall
    everyone behind it. The work is cancelled when the connection closes (the batcher drops
    cancelled items before they run; a cache flight's waiters take over as for any leader)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=_CLIENT_CHECK_S)
            if done:
                return task.result()
            transport = client.transport
            if transport is None or transport.is_closing():
                task.cancel()
                raise ClientClosed("the client closed the connection before the answer")
    except asyncio.CancelledError:
        task.cancel()
        raise
