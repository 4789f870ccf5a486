"""A Redis ACL user on a real server, for tests that cut one client off from some commands
(a stream tail from XREAD, a purge from SCAN) while the admin client and the rest go on."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from redis.asyncio import Redis

from tests.support.servers import RedisServer


@dataclass(frozen=True)
class AclUser:
    url: str  # the user's own URL
    name: str
    admin: Redis  # the default user's client: grants and revokes

    async def deny(self, *commands: str) -> None:
        await self.admin.execute_command("ACL", "SETUSER", self.name, *(f"-{c}" for c in commands))

    async def allow(self, *commands: str) -> None:
        await self.admin.execute_command("ACL", "SETUSER", self.name, *(f"+{c}" for c in commands))


@asynccontextmanager
async def acl_user(server: RedisServer, *denied: str) -> AsyncIterator[AclUser]:
    """A user that may run every command but `denied`, deleted afterwards."""
    admin = Redis.from_url(server.url)
    name = f"u{uuid.uuid4().hex[:8]}"
    rules = ("on", ">pw", "~*", "&*", "+@all", *(f"-{c}" for c in denied))
    await admin.execute_command("ACL", "SETUSER", name, *rules)
    try:
        yield AclUser(f"redis://{name}:pw@127.0.0.1:{server.port}/0", name, admin)
    finally:
        await admin.execute_command("ACL", "DELUSER", name)
        await admin.aclose()
