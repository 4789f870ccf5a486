"""Invalidations and admin purges reaching the sibling workers of `--workers N`.

Each worker's memory tier is its own. With Redis, the purge fan-out (cache.purge_fanout) carries
an invalidation's one key to every process, workers included; without it, nothing did: a DELETE
taken by one worker left the others serving their copy of the GET until its TTL (SIGUSR1, what
an admin purge sends, drops every tenant's entries, which an invalidation must not). Now the
worker that took it posts the key's selector to each sibling's private unix socket (the one
worker_metrics serves /metrics on, in the 0700 directory the parent made), and waits, within
`TIMEOUT_S`, for their answers before the client hears of its change. A sibling that does not
answer in time (starting, or gone) is logged; it has served nothing from a tier that is not
there, or its copy lives until its TTL as before.

An admin purge goes the same way, with or without Redis, by its own selector (route, model,
tenant, or all): each sibling drops what matches and no more, and the purge answers once they
have. Before, the purging worker sent the parent a SIGUSR1, and every other worker dropped its
whole memory tier (every tenant's entries: a purge of one tenant cost the others their hits)
some time after the admin had been told it was done.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web

from cache import Selector
from gateway.worker_metrics import Workers

log = logging.getLogger("latentgate.worker_drops")

PATH = "/drop"
TIMEOUT_S = 1.0
_FIELDS = ("route_h", "model_h", "tenant_h", "key")
_REQUIRED = "a selector is required: {route_h, model_h, tenant_h, key}, each a string or null"


def parse(doc: object) -> Selector | None:
    """A selector a sibling sent: each field a non-empty string or null, all four present (every
    null: everything); a key comes with its own three hashes, so it can name no other entry."""
    if not isinstance(doc, dict) or set(doc) != set(_FIELDS):
        return None
    parts = [doc[f] for f in _FIELDS]
    if not all(p is None or (isinstance(p, str) and p) for p in parts):
        return None
    selector = Selector(*parts)
    if selector.key is not None and Selector.of_value(selector.key) != selector:
        return None
    return selector


def handler(apply: Callable[[Selector], Awaitable[int]]) -> Callable[..., Awaitable[web.Response]]:
    """The sibling's side: drop what a sibling's invalidation or purge names."""

    async def drop(request: web.Request) -> web.Response:
        try:
            selector = parse(json.loads(await request.read()))
        except (ValueError, RecursionError):  # (RecursionError: JSON nested too deeply)
            selector = None
        if selector is None:
            return web.json_response({"error": _REQUIRED}, status=400)
        dropped = await apply(selector)
        return web.json_response({"dropped": dropped})

    return drop


class SiblingDrops:
    """The invalidating worker's side: every sibling told, at once, within TIMEOUT_S."""

    def __init__(self, workers: Workers) -> None:
        self.workers = workers

    async def announce(self, selector: Selector) -> dict[str, int | str]:
        """What each sibling did, by worker index: entries dropped, or why it was not told."""
        body = {f: getattr(selector, f) for f in _FIELDS}
        others = [i for i in range(self.workers.count) if i != self.workers.index]
        told = await asyncio.gather(*(self._tell(i, body) for i in others))
        return {str(i): t for i, t in zip(others, told, strict=True)}

    async def _tell(self, index: int, body: dict[str, str | None]) -> int | str:
        what = "an invalidation" if body["key"] is not None else "a purge"
        connector = aiohttp.UnixConnector(path=self.workers.socket(index))
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        try:
            async with (
                aiohttp.ClientSession(connector=connector, timeout=timeout) as s,
                s.post("http://worker" + PATH, json=body) as r,
            ):
                if r.status == 200:
                    return int((await r.json())["dropped"])
                log.warning("worker %d refused %s (%d)", index, what, r.status)
                return f"refused ({r.status})"
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError, KeyError) as exc:
            log.warning(
                "worker %d was not told of %s (%r): its copy lives until its TTL", index, what, exc
            )
            return f"not told ({type(exc).__name__})"
