"""The Redis tier's purges: SCAN a selector's pattern and UNLINK what each page finds, node by
node, from where the last try stopped. A mixin of RedisTier: it uses the tier's client, both
breakers, deadline guard and metrics; the purges that wait for Redis are
cache.tiers.redis_purges.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

from redis.asyncio import RedisCluster

from cache.breaker import CLOSED, Breaker
from cache.errors import TierError
from cache.keys import Selector
from cache.metrics import CacheMetrics
from cache.redis_client import AnyRedis
from cache.settings import RedisSettings
from cache.tiers.redis_writes import WriteGate


class PurgeScans:
    # the tier's (cache.tiers.redis.RedisTier)
    client: AnyRedis
    settings: RedisSettings
    prefix: str
    breaker: Breaker
    writes: WriteGate
    _metrics: CacheMetrics

    def _guard(
        self, op: str, deadline_s: float | None = None, write: bool = False
    ) -> AbstractAsyncContextManager[None]:
        raise NotImplementedError

    async def purge(self, selector: Selector, where: dict[str, int] | None = None) -> int:
        """SCAN the selector's pattern and UNLINK what each page finds; raises TierError if Redis
        fails. `where`: the SCAN cursor of each node not done yet, kept page by page (empty:
        from the start): a waiting purge's next try goes on from where its last one ran out of
        timeouts.admin (cache.tiers.redis_purges). Before, each try began at cursor 0 again, so
        one too big to scan within the deadline (a tenant's purge on a Redis holding everyone's
        entries) never landed, and its keys stayed unread in every process told of it."""
        where = {} if where is None else where
        match = self.prefix + selector.pattern()
        removed = 0
        if not self.writes.allow():
            # Redis down, or stalling writes: its UNLINKs would wait out a timeout each, and an
            # operator's purge waited with them; it waits in WaitingPurges instead, at once
            self._metrics.redis_errors.labels("purge", "skipped").inc()
            raise TierError("redis writes are marked down (breaker open): not sent")
        async with self._guard("purge", self.settings.timeouts.admin, write=True):
            if not where:
                where.update(self._scan_start())
            while where:
                name, cursor = next(iter(where.items()))
                found = await self._scan_page(name, cursor, match)
                if found is None:  # a node the cluster no longer has: from the start again
                    where.clear()
                    where.update(self._scan_start())
                    continue
                cursor, keys = found
                if keys:
                    removed += int(await self.client.unlink(*keys))
                if cursor:  # (after the UNLINK: a try cut short there scans that page again)
                    where[name] = cursor
                else:
                    del where[name]
        return removed

    async def purge_ready(self) -> bool:
        """Whether a waiting purge may run now: the breaker is closed, or a PING let through as
        its half-open probe closed it. Not the SCAN itself: the probe is the one call let
        through, every other refused until it ends, so this process read nothing from Redis
        for as long as the SCAN ran (up to timeouts.admin, in every process told of it). With
        writes stalled it waits too (its UNLINKs would time out), then is their probe."""
        if self.breaker.state == CLOSED:
            return self.writes.allow_probe()
        if not self.breaker.allow():
            return False
        try:
            async with self._guard("ping"):
                await self.client.ping()
        except TierError:
            return False
        return self.breaker.state == CLOSED and self.writes.allow_probe()

    def _scan_start(self) -> dict[str, int]:
        """Cursor 0 on every primary (standalone and sentinel: the one server, named '')."""
        if not isinstance(self.client, RedisCluster):
            return {"": 0}
        return {n.name: 0 for n in self.client.get_primaries()}

    async def _scan_page(self, name: str, cursor: int, match: str) -> tuple[int, list[Any]] | None:
        """One SCAN page of one node: its next cursor (0: done) and keys; None: no such node."""
        client: Any = self.client
        if not isinstance(client, RedisCluster):
            cursor, keys = await client.scan(cursor, match=match, count=1000)
            return int(cursor), list(keys)
        node = client.get_node(node_name=name)
        if node is None:
            return None
        # ({node name: cursor}, keys) from a cluster client (redis.cluster.parse_scan_result)
        page: Any = await client.scan(cursor, match=match, count=1000, target_nodes=node)
        return int(page[0][name]), list(page[1])
