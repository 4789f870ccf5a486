"""An unsafe request's invalidation reaching the sibling workers of `--workers N` without Redis.

Each worker's memory tier is its own. With Redis, the purge fan-out (cache.purge_fanout) carries
an invalidation's one key to every process, workers included; without it, nothing did: a DELETE
taken by one worker left the others serving their copy of the GET until its TTL (SIGUSR1, what
an admin purge sends, drops every tenant's entries, which an invalidation must not). Now the
worker that took it posts the key's selector to each sibling's private unix socket (the one
worker_metrics serves /metrics on, in the 0700 directory the parent made), and waits, within
`TIMEOUT_S`, for their answers before the client hears of its change. A sibling that does not
answer in time (starting, or gone) is logged; it has served nothing from a tier that is not
there, or its copy lives until its TTL as before.
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


def handler(apply: Callable[[Selector], Awaitable[int]]) -> Callable[..., Awaitable[web.Response]]:
    """The sibling's side: drop the one key a sibling's invalidation names."""

    async def drop(request: web.Request) -> web.Response:
        try:
            doc = json.loads(await request.read())
            parts = [doc[f] for f in _FIELDS]
        except (ValueError, KeyError, TypeError):
            return web.json_response({"error": "a one-key selector is required"}, status=400)
        if not all(isinstance(p, str) and p for p in parts):
            return web.json_response({"error": "a one-key selector is required"}, status=400)
        dropped = await apply(Selector(*parts))
        return web.json_response({"dropped": dropped})

    return drop


class SiblingDrops:
    """The invalidating worker's side: every sibling told, at once, within TIMEOUT_S."""

    def __init__(self, workers: Workers) -> None:
        self.workers = workers

    async def announce(self, selector: Selector) -> None:
        if selector.key is None:
            return
        body = {f: getattr(selector, f) for f in _FIELDS}
        others = [i for i in range(self.workers.count) if i != self.workers.index]
        await asyncio.gather(*(self._tell(i, body) for i in others))

    async def _tell(self, index: int, body: dict[str, str | None]) -> None:
        connector = aiohttp.UnixConnector(path=self.workers.socket(index))
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        try:
            async with (
                aiohttp.ClientSession(connector=connector, timeout=timeout) as s,
                s.post("http://worker" + PATH, json=body) as r,
            ):
                if r.status != 200:
                    log.warning("worker %d refused an invalidation (%d)", index, r.status)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.warning(
                "worker %d was not told of an invalidation (%r): its copy lives until its TTL",
                index,
                exc,
            )
