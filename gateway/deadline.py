"""A cached request's budget: the route's upstream total. Waiting for another request's answer
(the in-process flight, a paraphrase's flight, another gateway's Redis lease) spends it, so the
upstream call that follows a fruitless wait gets what is left, and none when nothing is (a 504,
not a second full timeout). Only those waits count: reading the body, parsing and the semantic
lookup are the request's own time, as they are on a route without a cache."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from backends import UpstreamRequest, UpstreamResponse
from cache import CallerGone
from gateway.errors import GatewayTimeout
from gateway.routing import Route

# Below this much spent waiting, the upstream call keeps the route's plain total (and sends no
# deadline header it would not have sent anyway).
_SPENT_S = 0.05


class BudgetSpent(GatewayTimeout, CallerGone):
    """This request's waits used its whole budget before it could call upstream. A flight it
    leads is abandoned, not failed: its waiters have budgets of their own."""


def route_budget_s(route: Route, backend: object) -> float | None:
    """The route's total (its own, else its remote backend's); None for a backend without one."""
    total = route.upstream.timeouts.total
    if total is None:
        timeouts = getattr(getattr(backend, "settings", None), "timeouts", None)
        total = getattr(timeouts, "total", None)
    return total if isinstance(total, int | float) else None


def within(
    left_s: Callable[[], float | None],
    budget_s: float | None,
    build: Callable[[], UpstreamRequest],
    send: Callable[[UpstreamRequest], Awaitable[UpstreamResponse]],
) -> Callable[[], Awaitable[UpstreamResponse]]:
    """The flow's compute: the upstream request built when the flow calls, carrying what the
    request's waits left of `budget_s` (`left_s()`, None: no budget)."""

    async def compute() -> UpstreamResponse:
        req = build()
        left = left_s()
        if left is not None and budget_s is not None:
            if left <= 0:
                raise BudgetSpent(
                    f"the request's {budget_s:g}s budget went on waiting for another "
                    "request's answer"
                )
            if left < budget_s - _SPENT_S:
                req.deadline_s = left if req.deadline_s is None else min(req.deadline_s, left)
        return await send(req)

    return compute
