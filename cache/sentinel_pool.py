"""The sentinel mode's connection pool: closing it closes its clients of the sentinels too.

cache.redis_client.connect makes a Sentinel (its clients of each sentinel) for one pool, so the
pool owns them; redis-py's closes only its connections to the primary.
"""

from __future__ import annotations

from redis.asyncio.sentinel import SentinelConnectionPool


class SentinelPool(SentinelConnectionPool):
    async def aclose(self) -> None:
        await super().aclose()
        # left open, every closed client (a reload's tier, publisher, tails) kept a connection
        # to each sentinel it had asked
        for client in self.sentinel_manager.sentinels:
            await client.aclose()
