"""A judge (`answer_match: judge`) that answers with an endless body (a bug, a URL that points
at a file server, a hostile endpoint): its answer is read up to JUDGE_ANSWER_CAP, then the
connection is closed and the verdict fails (no label, never a guess). Before, the judge's
answer was read whole in the background, all 256 MiB the endpoint offers here (an endless one
until the judge's timeout), and then failed to parse."""

from __future__ import annotations

import asyncio

import pytest

from backends.remote.transports.factory import make_transport
from backends.settings import RemoteBackendSettings
from cache.semantic.judge import (
    JUDGE_ANSWER_CAP,
    JudgeFailed,
    JudgeMatch,
    backend_judge,
    url_judge,
)
from tests.support.endless_replica import IN_FLIGHT, EndlessReplica

# far beyond what reading the cap takes: the cap, not the clock, ends the read
TIMEOUT_S = 120.0


async def test_a_url_judges_endless_answer_is_no_verdict_and_not_read_on() -> None:
    replica = EndlessReplica(200, b"application/json")
    url = await replica.raw.start()
    post, close = url_judge(url + "/v1/chat/completions", {}, TIMEOUT_S)
    try:
        with pytest.raises(JudgeFailed, match=f"over {JUDGE_ANSWER_CAP} bytes"):
            await JudgeMatch(post, "judge-model").agree("q", "a", "b")
        await asyncio.wait_for(replica.closed.wait(), 60)
        assert JUDGE_ANSWER_CAP < replica.sent < JUDGE_ANSWER_CAP + IN_FLIGHT
    finally:
        await close()
        await replica.raw.stop()


@pytest.mark.parametrize("client", ["lean", "aiohttp"])
async def test_a_backend_judges_endless_answer_is_no_verdict_and_not_read_on(client: str) -> None:
    replica = EndlessReplica(200, b"application/json")
    url = await replica.raw.start()
    settings = RemoteBackendSettings(replicas=[url], pool={"http_client": client})
    transport = make_transport(url, settings)
    post = backend_judge(lambda _: transport, "judge", "/v1/chat/completions", {}, TIMEOUT_S)
    try:
        with pytest.raises(JudgeFailed, match=f"over {JUDGE_ANSWER_CAP} bytes"):
            await JudgeMatch(post, "judge-model").agree("q", "a", "b")
        await asyncio.wait_for(replica.closed.wait(), 60)
        assert JUDGE_ANSWER_CAP < replica.sent < JUDGE_ANSWER_CAP + IN_FLIGHT
    finally:
        await transport.aclose()
        await replica.raw.stop()
