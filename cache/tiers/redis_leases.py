"""The Redis tier's single-flight leases across processes (`SET <prefix>l:<key> NX PX`): taken by
the process that computes a miss, asked after by the others while they wait for its answer,
released by compare-and-delete on the taker's token. A mixin of RedisTier: it uses the tier's
client, breaker, deadline guard and background tasks.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Coroutine
from contextlib import AbstractAsyncContextManager
from typing import Any

from redis.commands.core import AsyncScript

from cache.breaker import Breaker
from cache.errors import TierError
from cache.redis_client import AnyRedis
from cache.settings import RedisSettings
from cache.tiers.redis_writes import WriteGate

RELEASE = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)


class Leases:
    # the tier's (cache.tiers.redis.RedisTier)
    client: AnyRedis
    settings: RedisSettings
    lock_prefix: str
    breaker: Breaker
    writes: WriteGate
    _op: float
    _release: AsyncScript

    def _guard(
        self, op: str, deadline_s: float | None = None, write: bool = False
    ) -> AbstractAsyncContextManager[None]:
        raise NotImplementedError

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        raise NotImplementedError

    async def acquire_lease(self, key: str, ttl_ms: int) -> str | None:
        """None only when Redis said another process holds the lease; otherwise a token, and
        this process computes ('' when nothing was sent, a breaker being open: nothing to
        release). Taking and releasing a lease are writes (`writes`: skipped while Redis stalls
        them), asking after one is a read.

        A SET NX that failed or timed out may still land once Redis catches up (the command
        went out), under this token: taking that for "another holds it" left the process
        waiting the lease's ttl for a peer that did not exist. The caller's release deletes the
        lease only if it carries this token, so one that never landed costs nothing.
        """
        if not self.writes.allow():
            return ""
        token = secrets.token_hex(8)
        try:
            async with self._guard("lease", write=True):
                got = await self.client.set(self.lock_prefix + key, token, nx=True, px=ttl_ms)
        except TierError:
            return token
        return token if got else None

    async def lease_held(self, key: str) -> bool:
        """Whether another process holds the key's lease: a key there without an expiry is
        none (every lease is taken with PX). Junk written there, or a PERSIST, made every miss
        of that key wait the lease's whole ttl for a peer that did not exist, again at each
        expiry of its entry, for as long as the key stayed."""
        if not self.breaker.allow():
            return False
        try:
            async with self._guard("lease"):
                return int(await self.client.pttl(self.lock_prefix + key)) > 0
        except TierError:
            return False

    async def release_lease(self, key: str, token: str, retry: bool = True) -> None:
        """Compare-and-delete: only a lease that carries this token goes. One that could not be
        released now (Redis slow or down) is tried once more in the background, so that other
        sidecars are not left to wait out its ttl."""
        if not token:
            return
        try:
            if not self.writes.allow():
                raise TierError("redis writes are marked down (breaker open)")
            async with self._guard("lease", write=True):
                await self._release(keys=[self.lock_prefix + key], args=[token])
        except TierError:
            if retry:
                self._spawn(self._release_later(key, token))

    async def _release_later(self, key: str, token: str) -> None:
        await asyncio.sleep(max(self.settings.breaker.open_s, self._op * 10))
        await self.release_lease(key, token, retry=False)
