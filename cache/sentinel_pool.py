"""The sentinel mode's connection pool: the primary's address is asked of the sentinels in a
task of its own, which no caller's deadline cancels; closing the pool closes its clients of the
sentinels too.

redis-py asks the sentinels one after another, each within its socket timeout (the connect
timeout, 0.25 s), and asks first from then on the one that answered. A sentinel that is frozen
(SIGSTOP, a hung VM) rather than down accepts the connection and never answers, and the tier's
op deadline (0.1 s) cancelled each new connection's question before that timeout fired: the
next sentinel was never asked, the frozen one stayed first, and no connection to Redis could be
opened while it stayed frozen (after a failover, no lookup, store or lease reached the promoted
replica). Here the question runs to its end whoever waits for it: a frozen sentinel costs one
socket timeout, and the next one answers and is asked first from then on. Connections opened
meanwhile join the question in flight rather than each asking again.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio.sentinel import SentinelConnectionPool


class SentinelPool(SentinelConnectionPool):
    def __init__(self, service_name: str, sentinel_manager: Any, **kwargs: Any) -> None:
        super().__init__(service_name, sentinel_manager, **kwargs)  # type: ignore[no-untyped-call]
        self._asking: asyncio.Task[Any] | None = None

    async def get_master_address(self) -> Any:
        if self._asking is None or self._asking.done():
            asking = super().get_master_address()  # type: ignore[no-untyped-call]
            self._asking = asyncio.ensure_future(asking)
            # (its failure is its waiters'; with none left, not news)
            self._asking.add_done_callback(lambda t: t.cancelled() or t.exception())
        return await asyncio.shield(self._asking)

    async def aclose(self) -> None:
        if self._asking is not None:
            self._asking.cancel()
            # (should redis-py spend the cancel, the sentinels' socket timeouts end it)
            await asyncio.wait({self._asking})
        await super().aclose()
        # left open, every closed client (a reload's tier, publisher, tails) kept a connection
        # to each sentinel it had asked
        for client in self.sentinel_manager.sentinels:
            await client.aclose()
