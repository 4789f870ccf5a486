"""Replicas that break HTTP in ways a framework would not let them (raw socket servers write
every byte), through a real gateway to a real client: the client gets a clear JSON error or a
whole answer, never a hang, and nothing broken is cached."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from tests.fault.conftest import pool_config
from tests.support.raw_replica import RawReplica
from tests.support.servers import ServerThread

StartGateway = Callable[..., ServerThread]
CLIENTS = ["lean", "aiohttp"]
# "does not hang": far above any timeout these gateways are given, far below pytest's
_BOUND_S = 60


@pytest.fixture(params=CLIENTS)
def http_client(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _passthrough(total: float) -> list[dict[str, Any]]:
    return [
        {
            "name": "files",
            "match": {"prefix": "/"},
            "backend": "pool",
            "upstream": {"timeouts": {"total": total}, "retries": {"max": 0}},
        }
    ]


async def test_an_upload_to_a_replica_that_never_reads_is_a_504_within_the_total(
    start_gateway: StartGateway, http_client: str
) -> None:
    """A replica that accepts the connection and never reads: a streamed upload (chunked, so
    passed through as it comes) fills the socket buffers and the gateway's writes stall. The
    route's total bounds the exchange there too; before, the lean transport waited for the
    replica to drain for ever and the client hung."""

    async def never_reads(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(3600)

    replica = RawReplica(never_reads)
    url = await replica.start()
    try:
        gw = start_gateway(pool_config([url], _passthrough(1), pool={"http_client": http_client}))

        async def upload() -> AsyncIterator[bytes]:
            for _ in range(200):  # 12.5 MiB: more than loopback's socket buffers hold
                yield b"x" * 65536

        async with (
            aiohttp.ClientSession() as s,
            s.post(
                gw.url + "/upload", data=upload(), timeout=aiohttp.ClientTimeout(total=_BOUND_S)
            ) as r,
        ):
            assert r.status == 504
            assert "timed out" in (await r.json())["error"]["message"]
    finally:
        await replica.stop()
