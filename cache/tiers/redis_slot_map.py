"""The Redis tier's cluster slot map, checked again when an operation ran out of its deadline.

redis-py re-reads the slot map only after a command of its own failed (a refused connection,
its socket timeout). A primary that is frozen (SIGSTOP, a hung VM) never fails a command: the
tier's op deadline cancels it first. Once the cluster had promoted the frozen primary's replica,
every lookup, store and lease for its slots, and every half-open probe of the breaker, went on to
the frozen node until it woke up. Here a deadline that ran out starts one check in the
background (never on a request's deadline): CLUSTER SLOTS from one node that answers, and only
if a primary there is not the one the client has is the map re-read. Re-reading has redis-py
reconnect every connection, so a slow but unchanged cluster is asked for CLUSTER SLOTS alone,
at most once per `every_s`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from redis.asyncio import RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.cluster import get_node_name

from cache.redis_client import REDIS_ERRORS, stop_task

log = logging.getLogger("latentgate.cache.redis")


class SlotMapCheck:
    def __init__(
        self,
        client: RedisCluster,
        deadline_s: float,
        every_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._deadline_s = deadline_s
        self._every_s = every_s
        self._clock = clock
        self._last = -every_s
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def soon(self) -> asyncio.Task[None] | None:
        """An operation ran out of its deadline: check the map, unless a check is running or
        one began less than `every_s` ago. The check it started, if it did."""
        if (
            self._closed
            or (self._task is not None and not self._task.done())
            or (self._clock() - self._last < self._every_s)
        ):
            return None
        self._last = self._clock()
        self._task = asyncio.ensure_future(self._check())
        return self._task

    async def _check(self) -> None:
        nodes = self._client.nodes_manager
        try:
            async with asyncio.timeout(self._deadline_s):
                if not self._moved(await self._slots()):
                    return
                await nodes.initialize()
            log.info("redis cluster: slot map re-read (a primary had changed)")
        except Exception as exc:  # (a client-library fault mid-failover too: RedisTier._guard)
            # the next deadline that runs out checks again
            log.debug("redis cluster: slot map check failed: %r", exc)

    async def _slots(self) -> list[tuple[ClusterNode, Any]]:
        """CLUSTER SLOTS from the first node that answers, within its socket timeout. The
        client's replicas are asked first: a frozen node is one the client has as a primary."""
        replicas, primaries = self._client.get_replicas(), self._client.get_primaries()
        random.shuffle(replicas)
        random.shuffle(primaries)
        failure: Exception = RuntimeError("the cluster client knows no node")
        for node in replicas + primaries:
            try:
                slots: list[Any] = await node.execute_command("CLUSTER SLOTS")
            except REDIS_ERRORS as exc:
                failure = exc
                continue
            return [(node, s) for s in slots]
        raise failure

    def _moved(self, slots: list[tuple[ClusterNode, Any]]) -> bool:
        """Whether a range's primary in CLUSTER SLOTS is not the client's for its first slot."""
        nodes = self._client.nodes_manager
        for asked, (first, _last, primary, *_replicas) in slots:
            host = primary[0].decode() if isinstance(primary[0], bytes) else primary[0]
            name = get_node_name(*nodes.remap_host_port(host or asked.host, int(primary[1])))
            have = nodes.slots_cache.get(int(first))
            if not have or have[0].name != name:
                return True
        return False

    async def aclose(self) -> None:
        # (an op timing out while the tier closes must not start a check on a closed client)
        self._closed = True
        await stop_task(self._task)
