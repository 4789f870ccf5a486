"""SIGTERM's drain ends within limits.shutdown_grace_s, as documented, with a stream still going.

Before, a stream that outlasted the grace went on through aiohttp's own shutdown, which waited
for it twice more with the same timeout: the process exited after three graces (past a
terminationGracePeriodSeconds sized by the docs), and with a grace of 0 (no bound to aiohttp)
not before the stream ended.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator

import aiohttp
import pytest

from tests.conftest import base_config
from tests.support.servers import GatewayProcess, ServerThread

pytestmark = pytest.mark.slow
# 80 words at 0.5 s an event: a stream of ~40 s, far past any grace below
LONG = {
    "model": "m",
    "stream": True,
    "messages": [{"role": "user", "content": " ".join(["word"] * 80)}],
}


@pytest.fixture
def procs() -> Iterator[list[GatewayProcess]]:
    started: list[GatewayProcess] = []
    yield started
    for p in started:
        p.stop(signal.SIGKILL, timeout=5)


async def _stream_through_a_drain(gw: GatewayProcess) -> tuple[bytes, float]:
    """The client's bytes of a long stream during which the gateway got SIGTERM, and the
    seconds from the signal to the process's exit."""
    assert gw.proc is not None
    got = b""
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            gw.url + "/v1/chat/completions", json=LONG, headers={"X-Test-Event-Delay": "0.5"}
        ) as r,
    ):
        assert r.status == 200
        got += await r.content.readany()  # the stream is going
        sent = time.monotonic()
        gw.proc.send_signal(signal.SIGTERM)
        try:
            async for chunk in r.content.iter_any():
                got += chunk
        except aiohttp.ClientPayloadError:
            pass  # cut when the grace ran out
    await asyncio.to_thread(gw.proc.wait, 60)
    return got, time.monotonic() - sent


@pytest.mark.parametrize("grace", [0, 3])
async def test_a_stream_past_the_grace_ends_with_it(
    upstream: ServerThread, procs: list[GatewayProcess], grace: int
) -> None:
    gw = GatewayProcess(base_config(upstream.url, limits={"shutdown_grace_s": grace})).start()
    procs.append(gw)
    got, took = await _stream_through_a_drain(gw)
    assert gw.proc is not None and gw.proc.returncode == 0, gw.log()
    # cut, never told it was whole; and the process gone within the grace (and some slack
    # for its own exit), not after three of them (before: ~9 s for 3) or the stream's end
    assert b"[DONE]" not in got
    assert took < 2 * grace + 2, (took, gw.log())
