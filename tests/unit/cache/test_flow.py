"""cache/flow.py on its own: the sequence, single flight and recordings, with a backend callable
standing in for the upstream (memory tier only; the Redis paths are covered through the gateway).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from backends import UpstreamError, UpstreamResponse
from cache import (
    AnswerIncomplete,
    Ask,
    Cache,
    CacheEntry,
    CacheFlow,
    Fresh,
    Hit,
    NoSemantic,
    request_directives,
)
from cache.settings import CacheSettings, ExactPolicy


@dataclass
class FakeCall:
    model: str | None = "m"
    deterministic: bool = True
    greedy: bool = True
    semantic_text: str | None = None
    context: Any = None


class AnyFraming:
    def serves(self, entry: CacheEntry) -> bool:
        return True

    def seal(self, content_type: str, data: bytes) -> bytes | list[bytes] | None:
        # the tests' streams are text/plain, whole once they end in END; other bodies are whole
        return data if content_type != "text/plain" or data.endswith(b"END") else None

    def takes_stream(self, leader: object) -> bool:
        return False

    def keeps(self, content_type: str) -> bool:
        return True


class NoClock:
    def add(self, name: str, since: float) -> float:
        return since


def _flow(**policy: Any) -> CacheFlow:
    cache = Cache(CacheSettings(tenant_secret="t" * 32), CollectorRegistry())
    rc = cache.for_route("r", ExactPolicy(enabled=True, tiers=["memory"], **policy))
    assert rc is not None
    return CacheFlow(rc, NoSemantic(), cache.flights)


def _ask(flow: CacheFlow, call: FakeCall | None = None, text: str = "q") -> Ask:
    return Ask(
        key=flow.key("m", {"q": text}, {}),
        directives=request_directives(None),
        call=call or FakeCall(),
        kind="raw",
        answers=AnyFraming(),
        clock=NoClock(),
    )


async def _chunks(parts: list[bytes], gate: asyncio.Event) -> AsyncIterator[bytes]:
    for i, part in enumerate(parts):
        if i == 1:
            await gate.wait()
        yield part


async def test_sampled_calls_are_neither_coalesced_nor_stored() -> None:
    flow = _flow()
    calls = 0

    async def compute() -> UpstreamResponse:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)
        return UpstreamResponse(200, "OK", [], body=b"draw")

    sampled = FakeCall(deterministic=False)
    results = await asyncio.gather(*(flow.run(_ask(flow, sampled), compute) for _ in range(5)))
    assert calls == 5
    assert all(isinstance(r, Fresh) and r.reason == "sampled" for r in results)
    assert flow.rc.lookup_l1(_ask(flow).key, request_directives(None)) is None


async def test_a_request_that_arrives_after_the_flight_closed_finds_the_entry() -> None:
    flow = _flow()
    calls = 0

    async def compute() -> UpstreamResponse:
        nonlocal calls
        calls += 1
        return UpstreamResponse(200, "OK", [], body=b"answer")

    first = await flow.run(_ask(flow), compute)
    assert isinstance(first, Fresh) and calls == 1
    # the exact lookup is skipped here to stand for a request that looked before the store:
    # winning the (closed) flight, it re-checks L1 instead of calling the backend again
    ask = _ask(flow)
    late = await flow._coalesced(ask, compute, "miss", None)
    assert isinstance(late, Hit) and late.entry.body == b"answer" and calls == 1


async def test_waiters_share_a_recorded_stream_once_it_completes() -> None:
    flow = _flow()
    gate = asyncio.Event()
    calls = 0

    async def compute() -> UpstreamResponse:
        nonlocal calls
        calls += 1
        stream = _chunks([b"part-", b"END"], gate)
        return UpstreamResponse(200, "OK", [("Content-Type", "text/plain")], stream=stream)

    leader = await flow.run(_ask(flow), compute)
    assert isinstance(leader, Fresh) and leader.recording is not None
    waiters = [asyncio.create_task(flow.run(_ask(flow), compute)) for _ in range(3)]
    await asyncio.sleep(0.01)
    assert not any(w.done() for w in waiters)  # the flight stays open while the stream goes
    gate.set()
    got = b"".join([c async for c in leader.recording.chunks()])
    await leader.recording.close()
    shared = await asyncio.gather(*waiters)
    assert got == b"part-END" and calls == 1
    assert all(isinstance(s, Hit) and s.entry.body == b"part-END" for s in shared)


async def test_waiters_of_an_unshareable_stream_fetch_their_own_when_the_leader_leaves() -> None:
    flow = _flow()
    gate = asyncio.Event()
    calls = 0

    async def compute() -> UpstreamResponse:
        nonlocal calls
        calls += 1
        headers = [("Content-Type", "text/plain"), ("Set-Cookie", "s=1")]
        if calls == 1:
            return UpstreamResponse(200, "OK", headers, stream=_chunks([b"a", b"END"], gate))
        return UpstreamResponse(200, "OK", headers, body=b"own")

    leader = await flow.run(_ask(flow), compute)
    assert isinstance(leader, Fresh) and leader.recording is not None
    waiter = asyncio.create_task(flow.run(_ask(flow), compute))
    await asyncio.sleep(0.01)
    # the leader's client goes away after the first chunk; nothing private is shared
    chunks = leader.recording.chunks()
    assert await chunks.__anext__() == b"a"
    await chunks.aclose()
    await leader.recording.close()
    own = await waiter
    assert isinstance(own, Fresh) and own.response.body == b"own" and calls == 2


async def test_a_stream_that_ended_unsealed_is_not_stored_and_its_waiters_fetch_their_own() -> None:
    """The upstream ended the stream, but not as a whole answer (no END: an error event, or
    a stream in no codec's form): nothing is stored, and the flight's waiters go upstream
    themselves rather than fail with the leader's 502."""
    flow = _flow()
    gate = asyncio.Event()
    gate.set()

    async def compute() -> UpstreamResponse:
        stream = _chunks([b"part-", b"cut"], gate)  # never ends in END: seal refuses it
        return UpstreamResponse(200, "OK", [("Content-Type", "text/plain")], stream=stream)

    leader = await flow.run(_ask(flow), compute)
    assert isinstance(leader, Fresh) and leader.recording is not None
    waiter = asyncio.create_task(flow.run(_ask(flow), compute))
    await asyncio.sleep(0)
    assert b"".join([c async for c in leader.recording.chunks()]) == b"part-cut"
    await leader.recording.close()
    own = await waiter
    assert isinstance(own, Fresh) and own.recording is not None  # its own upstream answer
    assert b"".join([c async for c in own.recording.chunks()]) == b"part-cut"
    await own.recording.close()
    assert flow.rc.lookup_l1(_ask(flow).key, request_directives(None)) is None


async def test_a_stream_cut_mid_way_fails_its_waiters() -> None:
    """A stream whose upstream failed mid-way (the read raised): the waiters share the
    failure (a 502), as the leader's client got a cut stream."""
    flow = _flow()
    joined = asyncio.Event()

    async def broken() -> AsyncIterator[bytes]:
        yield b"part-"
        await joined.wait()
        raise ConnectionResetError("the replica hung up")

    async def compute() -> UpstreamResponse:
        return UpstreamResponse(200, "OK", [("Content-Type", "text/plain")], stream=broken())

    leader = await flow.run(_ask(flow), compute)
    assert isinstance(leader, Fresh) and leader.recording is not None
    waiter = asyncio.create_task(flow.run(_ask(flow), compute))
    await asyncio.sleep(0.05)  # the waiter is on the flight
    joined.set()
    with pytest.raises(UpstreamError, match="the replica hung up"):
        async for _ in leader.recording.chunks():
            pass
    await leader.recording.close()
    with pytest.raises(AnswerIncomplete):
        await waiter


async def test_a_leader_out_of_budget_hands_its_flight_to_a_waiter_with_budget_left() -> None:
    """A leader whose waits spent its budget gets its own 504 (BudgetSpent), but its waiters,
    whose budgets are their own, are not failed with it: one of them takes over and computes."""
    from backends import UpstreamRequest
    from gateway.deadline import BudgetSpent, within

    flow = _flow()
    sent: list[float | None] = []

    async def send(req: UpstreamRequest) -> UpstreamResponse:
        sent.append(req.deadline_s)
        return UpstreamResponse(200, "OK", [], body=b"answer")

    def build() -> UpstreamRequest:
        return UpstreamRequest(method="POST", path_qs="/", headers=[], body=b"q")

    spent = _ask(flow)
    spent.budget_s, spent.waited_s = 2.0, 2.5  # its waits (elsewhere) took more than its budget
    fresh = _ask(flow)
    fresh.budget_s = 2.0
    gate = asyncio.Event()
    spent_compute = within(spent.left_s, 2.0, build, send)

    async def lead() -> UpstreamResponse:
        await gate.wait()  # until the waiter has joined the flight
        return await spent_compute()

    leader = asyncio.create_task(flow.run(spent, lead))
    await asyncio.sleep(0.01)  # the spent request leads the flight
    waiter = asyncio.create_task(flow.run(fresh, within(fresh.left_s, 2.0, build, send)))
    await asyncio.sleep(0.01)  # the fresh one waits on it
    gate.set()
    with pytest.raises(BudgetSpent):
        await leader
    result = await waiter
    assert isinstance(result, Fresh) and result.response.body == b"answer"
    assert sent == [None]  # one upstream call, the waiter's, with its whole budget
