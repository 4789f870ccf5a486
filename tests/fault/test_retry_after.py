"""A replica's Retry-After (RFC 9110 10.2.3) against the pool's retries: real replica processes."""

from __future__ import annotations

import time
from collections.abc import Callable
from email.utils import formatdate

import aiohttp
import pytest

from backends.remote.retry import retry_after_s
from tests.fault.conftest import CHAT, Replicas, load, metric, pool_config
from tests.support.servers import ServerThread

pytestmark = pytest.mark.slow
StartGateway = Callable[..., ServerThread]
PATH = "/v1/chat/completions"
SAMPLED = {**CHAT, "temperature": 1}  # never cached: every call reaches a replica


async def _post(url: str, headers: dict[str, str]) -> tuple[int, str | None, dict[str, object]]:
    async with aiohttp.ClientSession() as s, s.post(url + PATH, json=SAMPLED, headers=headers) as r:
        return r.status, r.headers.get("Retry-After"), await r.json()


async def _calls(rep: object) -> int:
    return int((await rep.stats())["requests"].get(PATH, 0))  # type: ignore[attr-defined]


async def test_a_wait_asked_past_the_deadline_answers_at_once_instead_of_retrying(
    replicas: Replicas, start_gateway: StartGateway
) -> None:
    """One replica that says 503 + Retry-After: 3600: hammering it twice more helps nobody and
    the client would wait out its deadline. Its answer goes back at once, Retry-After kept."""
    rep = replicas.start(())[0]
    gw = start_gateway(pool_config([rep.url], outlier={"enabled": False}))
    for after in ("3600", formatdate(time.time() + 3600, usegmt=True)):
        before = await _calls(rep)
        status, retry_after, body = await _post(
            gw.url, {"X-Test-Status": "503", "X-Test-Retry-After": after}
        )
        assert (status, retry_after) == (503, after)
        assert body["error"]["message"] == "injected 503"  # type: ignore[index]
        assert await _calls(rep) == before + 1  # no retry
    assert (
        await metric(
            gw.url, "latentgate_upstream_retries_total", outcome="retry_after_past_deadline"
        )
        == 2
    )


async def test_a_short_wait_is_honoured_before_going_back_to_the_same_replica(
    replicas: Replicas, start_gateway: StartGateway
) -> None:
    rep = replicas.start(())[0]
    gw = start_gateway(pool_config([rep.url], outlier={"enabled": False}))
    start = time.monotonic()
    status, retry_after, _ = await _post(
        gw.url, {"X-Test-Status": "503", "X-Test-Retry-After": "1"}
    )
    took = time.monotonic() - start
    assert (status, retry_after) == (503, "1")
    assert await _calls(rep) == 3  # the first attempt and two retries (retries.max)
    # Two retries, each a second after the answer before it: a floor, not a speed target.
    assert took >= 2.0


async def test_another_replica_takes_the_retry_at_once(
    replicas: Replicas, start_gateway: StartGateway
) -> None:
    """Retry-After speaks for the replica that said it: a fresh one takes the retry now (a wait
    past the 2 s deadline would have turned every one of these into that replica's 503)."""
    busy = replicas.start(("--fail-status", "503", "--retry-after", "3600"))[0]
    ok = replicas.start(())[0]
    routes = [
        {
            "name": "chat",
            "match": {"path": PATH},
            "protocol": "openai",
            "backend": "pool",
            "upstream": {"timeouts": {"total": 2}},
        }
    ]
    gw = start_gateway(
        pool_config(
            [busy.url, ok.url],
            routes,
            outlier={"enabled": False},
            balancer={"policy": "round_robin"},
            retry_budget={"percent": 100, "reserve": 100},  # every busy answer may be retried
        )
    )
    res = await load(gw.url, 20, 2, body=SAMPLED)
    assert set(res.statuses) == {200}
    assert set(res.served_by) == {ok.name}
    assert await _calls(busy) >= 5  # it was asked, and its answers were retried elsewhere


def test_retry_after_forms() -> None:
    now = 1_700_000_000.0
    assert retry_after_s("120", now) == 120.0
    assert retry_after_s(" 0 ", now) == 0.0
    assert retry_after_s(formatdate(now + 30, usegmt=True), now) == 30.0
    assert retry_after_s(formatdate(now - 30, usegmt=True), now) == 0.0  # past: retry now
    for bad in (None, "", "-5", "1.5", "soon", "١٢", "Fri, 99 Foo 2026 00:00:00 GMT"):
        assert retry_after_s(bad, now) is None, bad


async def test_a_wait_one_replica_asked_neither_stops_nor_steers_the_others(
    replicas: Replicas, start_gateway: StartGateway
) -> None:
    """Retry-After speaks for the replica that sent it. With one replica answering a plain 503
    and the other 503 + Retry-After: 3600, each request's retries go back to the plain one
    (it asked no wait) and never again to the one that asked: neither does the last answer's
    Retry-After end the retries, nor is the asking replica asked again."""
    plain = replicas.start(("--fail-status", "503"))[0]
    asking = replicas.start(("--fail-status", "503", "--retry-after", "3600"))[0]
    gw = start_gateway(
        pool_config(
            [plain.url, asking.url],
            outlier={"enabled": False},
            balancer={"policy": "round_robin"},
            retry_budget={"percent": 100, "reserve": 100},
        )
    )
    for _ in range(2):  # round robin: one request starts on each replica
        status, _, _ = await _post(gw.url, {})
        assert status == 503
    # each request: three attempts (retries.max 2), one of them on the asking replica
    assert (await _calls(plain), await _calls(asking)) == (4, 2)
