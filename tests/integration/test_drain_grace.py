"""SIGTERM's drain ends within limits.shutdown_grace_s, as documented, with a stream still going.

Before, a stream that outlasted the grace went on through aiohttp's own shutdown, which waited
for it twice more with the same timeout: the process exited after three graces (past a
terminationGracePeriodSeconds sized by the docs), and with a grace of 0 (no bound to aiohttp)
not before the stream ended.
"""

from __future__ import annotations

import asyncio
import signal

import aiohttp
import pytest

from tests.conftest import base_config
from tests.support.servers import GatewayProcess, ServerThread

pytestmark = pytest.mark.slow


def _stream_of(words: int) -> dict[str, object]:
    """A chat stream of one event per word, 0.5 s apart (X-Test-Event-Delay)."""
    return {
        "model": "m",
        "stream": True,
        "messages": [{"role": "user", "content": " ".join(["word"] * words)}],
    }


async def _stream_through_a_drain(gw: GatewayProcess, words: int) -> bytes:
    """The client's bytes of a stream during which the gateway got SIGTERM; returns once the
    process has exited."""
    assert gw.proc is not None
    got = b""
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            gw.url + "/v1/chat/completions",
            json=_stream_of(words),
            headers={"X-Test-Event-Delay": "0.5"},
        ) as r,
    ):
        assert r.status == 200
        got += await r.content.readany()  # the stream is going
        gw.proc.send_signal(signal.SIGTERM)
        try:
            async for chunk in r.content.iter_any():
                got += chunk
        except aiohttp.ClientPayloadError:
            pass  # cut when the grace ran out
    await asyncio.to_thread(gw.proc.wait, 60)
    return got


@pytest.mark.parametrize(
    ("grace", "words"),
    [
        (0, 80),  # ~40 s: before, the process waited for the stream's end
        (3, 14),  # ~7 s, past the grace and within three of them: before, it ran to its end
    ],
)
async def test_a_stream_past_the_grace_is_cut_when_the_grace_ends(
    upstream: ServerThread, procs: list[GatewayProcess], grace: int, words: int
) -> None:
    """No timing bound: a stream that outlasts the grace is cut (never told it was whole),
    where before it was carried to its [DONE] through aiohttp's own, longer shutdown."""
    gw = GatewayProcess(base_config(upstream.url, limits={"shutdown_grace_s": grace})).start()
    procs.append(gw)
    got = await _stream_through_a_drain(gw, words)
    assert gw.proc is not None and gw.proc.returncode == 0, gw.log()
    assert got.startswith(b"data: ")  # the stream was going when the signal came
    assert b"[DONE]" not in got, gw.log()
