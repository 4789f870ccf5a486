"""Pure pool logic: balancers, the retry budget, backoff, outlier ejection, breaker, hedging."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from backends.base import UpstreamRequest, UpstreamResponse
from backends.errors import Overloaded, UpstreamConnectError, UpstreamProtocolError, UpstreamTimeout
from backends.remote.balancer import Affinity, LeastRequest, RoundRobin, Weighted
from backends.remote.breaker import Breaker
from backends.remote.health import OutlierDetector, max_ejected
from backends.remote.hedge import LatencyWindow, hedge_delay_s, race
from backends.remote.metrics import RemoteMetrics
from backends.remote.replica import Replica
from backends.remote.retry import RetryBudget, backoff_s, retryable_error
from backends.settings import (
    BreakerSettings,
    HedgeSettings,
    OutlierSettings,
    RetryBudgetSettings,
)


class _Unused:
    """Balancer and outlier logic never touch the transport."""

    url = "unused"

    async def send(
        self, request: UpstreamRequest, *, connect_s: float | None = None
    ) -> UpstreamResponse:
        raise AssertionError("not sent")

    def pool_stats(self) -> dict[str, int]:
        return {"idle": 0, "in_use": 0, "limit": 1}

    async def aclose(self) -> None:
        return None


def _replicas(n: int) -> list[Replica]:
    return [Replica(f"http://r{i}", _Unused()) for i in range(n)]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# balancers ----------------------------------------------------------------------------------
def test_p2c_prefers_less_loaded_and_never_picks_the_busiest_of_three() -> None:
    rs = _replicas(3)
    rs[0].outstanding, rs[1].outstanding, rs[2].outstanding = 10, 0, 5
    lb = LeastRequest(0.0, random.Random(1))
    picks = Counter(lb.pick(rs, None, 0.0).url for _ in range(300))
    assert picks["http://r0"] == 0  # it loses every pair it is in
    assert picks["http://r1"] > picks["http://r2"] > 0


def test_p2c_slow_start_ramps_a_returning_replica() -> None:
    rs = _replicas(2)
    rs[1].slow_start_from = 100.0  # rejoined at t=100, 10 s slow start
    lb = LeastRequest(10.0, random.Random(2))
    rs[0].outstanding = 3
    assert lb.pick(rs, None, 100.5) is rs[0]  # at 10 % weight r1 costs more than r0 with 3
    assert lb.pick(rs, None, 120.0) is rs[1]  # ramp over: plain least-request


def test_round_robin_and_weighted_spread() -> None:
    rs = _replicas(3)
    rr = RoundRobin()
    assert Counter(rr.pick(rs, None, 0).url for _ in range(30)) == {r.url: 10 for r in rs}
    ws = [Replica(f"http://w{i}", _Unused(), weight=w) for i, w in enumerate([1.0, 2.0, 5.0])]
    wb = Weighted(0.0)
    got = Counter(wb.pick(ws, None, 0).url for _ in range(80))
    assert got == {"http://w0": 10, "http://w1": 20, "http://w2": 50}


def test_affinity_is_stable_moves_only_the_lost_keys_and_bounds_load() -> None:
    rs = _replicas(4)
    lb = Affinity(rs, 1.25)
    keys = [f"tenant-{i}".encode() for i in range(200)]
    home = {k: lb.pick(rs, k, 0) for k in keys}
    assert all(lb.pick(rs, k, 0) is home[k] for k in keys)
    assert len(set(map(id, home.values()))) == 4
    without = [r for r in rs if r is not rs[0]]
    for k in keys:
        moved = lb.pick(without, k, 0)
        if home[k] is not rs[0]:
            assert moved is home[k]  # consistent: only the ejected replica's keys move
        else:
            assert moved is not rs[0]
    # A hot key: once its home carries more than 1.25x the mean it spills over.
    hot = keys[0]
    home[hot].outstanding = 20
    assert lb.pick(rs, hot, 0) is not home[hot]


# retry budget and backoff --------------------------------------------------------------------
def test_budget_concurrency_limit_and_minimum() -> None:
    clock = Clock()
    b = RetryBudget(RetryBudgetSettings(percent=20, min_concurrency=2, reserve=100), clock)
    for _ in range(3):
        b.request_started()
    assert b.try_acquire() and b.try_acquire()
    assert not b.try_acquire()  # 20 % of 3 active is 0: the minimum of 2 applies
    b.release()
    assert b.try_acquire()
    for _ in range(27):
        b.request_started()
    assert b.try_acquire() and b.try_acquire() and b.try_acquire()  # 30 active: 6 allowed
    assert b.try_acquire() and b.try_acquire() is False  # the 6th is granted, the 7th is not


def test_budget_volume_bounded_by_percent_of_requests_plus_reserve() -> None:
    clock = Clock()
    b = RetryBudget(
        RetryBudgetSettings(percent=20, min_concurrency=1000, min_per_s=0, reserve=5), clock
    )
    granted = 0
    for _ in range(1000):
        b.request_started()
        if b.try_acquire():
            granted += 1
            b.release()
        b.request_finished()
    assert 200 <= granted <= 205
    clock.now += 10  # min_per_s=0: time alone earns nothing
    assert not b.try_acquire()


def test_backoff_full_jitter_grows_and_caps() -> None:
    rng = random.Random(3)
    for attempt, ceiling in [(1, 0.025), (2, 0.05), (3, 0.1), (6, 0.25)]:
        xs = [backoff_s(attempt, 25, 250, rng) for _ in range(200)]
        assert min(xs) >= 0 and max(xs) <= ceiling
        assert max(xs) > ceiling * 0.8  # jitter spans the range


def test_retryable_errors() -> None:
    assert retryable_error(UpstreamConnectError("refused"))
    assert retryable_error(UpstreamProtocolError("hung up before answering"))
    assert not retryable_error(UpstreamTimeout("slow"))


# outlier detection -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("n", "pct", "want"), [(1, 10, 0), (2, 10, 1), (3, 10, 1), (20, 10, 2), (3, 100, 2), (5, 0, 0)]
)
def test_max_ejected_envoy_semantics(n: int, pct: float, want: int) -> None:
    assert max_ejected(n, pct) == want


def test_consecutive_errors_eject_for_growing_interval_then_rejoin_with_slow_start() -> None:
    clock = Clock()
    rs = _replicas(3)
    s = OutlierSettings(consecutive_errors=3, base_ejection_s=10, max_ejection_s=25)
    d = OutlierDetector("b", rs, s, RemoteMetrics(), clock)
    for _ in range(2):
        d.on_result(rs[0], True, None)
    d.on_result(rs[0], False, 0.01)  # a success resets the streak
    for _ in range(2):
        d.on_result(rs[0], True, None)
    assert not rs[0].ejected(clock.now)
    d.on_result(rs[0], True, None)
    assert rs[0].ejected_until == clock.now + 10
    for _ in range(3):  # a second replica would exceed 10 % of 3 (at least one is allowed)
        d.on_result(rs[1], True, None)
    assert not rs[1].ejected(clock.now)
    clock.now += 10
    d.sweep()
    assert not rs[0].ejected(clock.now) and rs[0].slow_start_from == clock.now
    for _ in range(3):
        d.on_result(rs[0], True, None)
    assert rs[0].ejected_until == clock.now + 20  # second ejection: 2 x base
    clock.now += 20
    d.sweep()
    for _ in range(3):
        d.on_result(rs[0], True, None)
    assert rs[0].ejected_until == clock.now + 25  # capped at max_ejection_s


def test_latency_outlier_ejected_only_when_far_above_the_others() -> None:
    clock = Clock()
    rs = _replicas(3)
    s = OutlierSettings(latency_factor=3.0, latency_min_excess_ms=50, latency_min_samples=5)
    d = OutlierDetector("b", rs, s, RemoteMetrics(), clock)
    for _ in range(10):
        d.on_result(rs[0], False, 0.010)
        d.on_result(rs[1], False, 0.012)
        d.on_result(rs[2], False, 0.030)  # 3x but only 19 ms above: not an outlier
    d.sweep()
    assert not any(r.ejected(clock.now) for r in rs)
    for _ in range(20):
        d.on_result(rs[2], False, 0.210)
    d.sweep()
    assert rs[2].ejected(clock.now) and not rs[0].ejected(clock.now)


# breaker ---------------------------------------------------------------------------------------
async def test_breaker_queues_up_to_max_pending_then_rejects() -> None:
    rejected: list[str] = []
    b = Breaker("b", BreakerSettings(max_in_flight=1, max_pending=1), lambda: 0, rejected.append)
    await b.acquire()
    waiter = asyncio.create_task(b.acquire())
    await asyncio.sleep(0)
    assert b.pending == 1
    with pytest.raises(Overloaded) as info:
        await b.acquire()
    assert info.value.retry_after_s == 1.0 and rejected == ["max_pending"]
    b.release()
    await waiter  # the slot passed to the waiter
    assert b.in_flight == 1 and b.pending == 0
    b.release()
    assert b.in_flight == 0
    full = Breaker("b", BreakerSettings(max_connections=2), lambda: 2, rejected.append)
    with pytest.raises(Overloaded):
        await full.acquire()
    assert rejected[-1] == "max_connections"


async def test_a_queued_acquire_gives_up_at_its_timeout_and_leaves_the_queue_sound() -> None:
    b = Breaker("b", BreakerSettings(max_in_flight=1, max_pending=10), lambda: 0, lambda _: None)
    await b.acquire()
    with pytest.raises(TimeoutError):
        await b.acquire(timeout_s=0.01)
    assert b.pending == 0 and b.in_flight == 1 and b.rejected["queue_deadline"] == 1
    # a waiter cancelled as the slot is released (the release passes over it): no error, and
    # the next waiter gets the slot
    first = asyncio.create_task(b.acquire(timeout_s=5))
    second = asyncio.create_task(b.acquire(timeout_s=5))
    await asyncio.sleep(0)
    first.cancel()
    b.release()
    with pytest.raises(asyncio.CancelledError):
        await first
    await second
    assert b.in_flight == 1 and b.pending == 0


# hedging ---------------------------------------------------------------------------------------
def _resp(status: int, replica: str) -> UpstreamResponse:
    return UpstreamResponse(status, "", [], body=b"", replica=replica)


async def test_race_hedge_wins_and_loser_is_cancelled() -> None:
    cancelled: list[str] = []

    async def slow() -> UpstreamResponse:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.append("slow")
            raise
        return _resp(200, "slow")

    async def fast() -> UpstreamResponse:
        await asyncio.sleep(0.01)
        return _resp(200, "fast")

    resp, won = await race(slow, fast, 0.02, lambda: True)
    assert resp.replica == "fast" and won and cancelled == ["slow"]


async def test_race_no_hedge_when_fast_or_budget_denied() -> None:
    async def quick() -> UpstreamResponse:
        return _resp(200, "a")

    hedged: list[bool] = []

    def may_hedge() -> bool:
        hedged.append(True)
        return True

    resp, won = await race(quick, quick, 0.5, may_hedge)
    assert not won and hedged == []

    async def slow_ok() -> UpstreamResponse:
        await asyncio.sleep(0.05)
        return _resp(200, "slow")

    resp, won = await race(slow_ok, quick, 0.01, lambda: False)
    assert resp.replica == "slow" and not won


async def test_race_5xx_waits_for_the_other_side() -> None:
    async def bad() -> UpstreamResponse:
        await asyncio.sleep(0.03)
        return _resp(503, "bad")

    async def good() -> UpstreamResponse:
        await asyncio.sleep(0.06)
        return _resp(200, "good")

    resp, won = await race(bad, good, 0.01, lambda: True)
    assert resp.status == 200 and won


def test_hedge_delay_from_percentile_with_fallback() -> None:
    w = LatencyWindow()
    s = HedgeSettings(after_percentile=90, after_ms=80)
    assert hedge_delay_s(s, w) == 0.08  # too few samples yet
    for i in range(100):
        w.add((i + 1) / 1000)
    assert hedge_delay_s(s, w) == pytest.approx(0.090)
