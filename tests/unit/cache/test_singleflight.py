"""Single flight: one computation for concurrent callers, shared errors, bounded waits, handover."""

from __future__ import annotations

import asyncio

import pytest

from cache.singleflight import SingleFlight


async def test_one_call_for_many_callers() -> None:
    sf: SingleFlight[int] = SingleFlight()
    calls = 0

    async def compute() -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05)
        return 42

    results = await asyncio.gather(*(sf.run("k", compute, 5) for _ in range(50)))
    assert calls == 1
    assert [r for r, _ in results] == [42] * 50
    assert sum(led for _, led in results) == 1
    assert sf.in_flight() == 0


async def test_leader_error_goes_to_every_waiter_without_retries() -> None:
    sf: SingleFlight[int] = SingleFlight()
    calls = 0

    async def compute() -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05)
        raise ValueError("backend down")

    results = await asyncio.gather(
        *(sf.run("k", compute, 5) for _ in range(20)), return_exceptions=True
    )
    assert calls == 1
    assert all(isinstance(r, ValueError) for r in results)


async def test_waits_are_bounded_then_the_waiter_computes_itself() -> None:
    sf: SingleFlight[str] = SingleFlight()

    async def slow() -> str:
        await asyncio.sleep(1.0)
        return "slow"

    async def fast() -> str:
        return "fast"

    leader = asyncio.create_task(sf.run("k", slow, 5))
    await asyncio.sleep(0.01)
    assert await sf.run("k", fast, 0.05) == ("fast", True)
    assert await leader == ("slow", True)


async def test_cancelled_leader_hands_over_to_a_waiter() -> None:
    sf: SingleFlight[str] = SingleFlight()
    started = asyncio.Event()

    async def never() -> str:
        started.set()
        await asyncio.sleep(10)
        return "never"

    async def quick() -> str:
        return "second"

    leader = asyncio.create_task(sf.run("k", never, 5))
    await started.wait()
    waiter = asyncio.create_task(sf.run("k", quick, 5))
    await asyncio.sleep(0.01)
    leader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leader
    assert await waiter == ("second", True)


async def test_unshareable_result_makes_waiters_compute() -> None:
    sf: SingleFlight[str] = SingleFlight()
    calls = 0

    async def compute() -> str:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.02)
        return "private"

    await asyncio.gather(*(sf.run("k", compute, 5, shareable=lambda r: False) for _ in range(3)))
    assert calls == 3
