"""Joining a recorded stream as it ends: a stream whose upstream failed has handed its readers
their end, so a request that comes after that is not given a reader of it (which no end would
ever reach: its client waited for the route's whole total, then was cut)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from backends import UpstreamError, UpstreamResponse
from cache import Fresh
from tests.unit.cache.test_flow import AnyFraming, _ask, _flow


class Streaming(AnyFraming):
    stream = True

    def takes_stream(self, leader: object) -> bool:
        return True


async def test_a_stream_cut_by_its_upstream_is_not_joined_after_its_readers_were_ended() -> None:
    flow = _flow()
    failed = asyncio.Event()

    async def broken() -> AsyncIterator[bytes]:
        yield b"part-"
        await failed.wait()
        raise ConnectionResetError("the replica hung up")

    async def compute() -> UpstreamResponse:
        return UpstreamResponse(200, "OK", [("Content-Type", "text/plain")], stream=broken())

    ask = _ask(flow)
    ask.answers = Streaming()
    leader = await flow.run(ask, compute)
    assert isinstance(leader, Fresh) and leader.recording is not None
    recording = leader.recording
    chunks = recording.chunks()
    assert await chunks.__anext__() == b"part-"
    failed.set()
    await asyncio.sleep(0)  # the pump reads the failure and ends its readers; settling is next
    # before: a reader that nothing would end (its client waited out the route's total)
    assert recording.follow(Streaming()) is None
    with pytest.raises(UpstreamError, match="the replica hung up"):
        async for _ in chunks:
            pass
    await recording.close()
