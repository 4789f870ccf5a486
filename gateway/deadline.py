"""A cached request's deadline: the route's upstream total, counted from when the request
arrived. Waiting for another request's answer (the in-process flight, a paraphrase's flight,
another gateway's Redis lease) spends it, so the upstream call that follows a fruitless wait
gets what is left, and none when nothing is (a 504, not a second full timeout)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from backends import UpstreamRequest, UpstreamResponse
from gateway.errors import GatewayTimeout
from gateway.routing import Route

# Below this much spent waiting, the upstream call keeps the route's plain total (and sends no
# deadline header it would not have sent anyway).
_SPENT_S = 0.05


def route_budget_s(route: Route, backend: object) -> float | None:
    """The route's total (its own, else its remote backend's); None for a backend without one."""
    total = route.upstream.timeouts.total
    if total is None:
        timeouts = getattr(getattr(backend, "settings", None), "timeouts", None)
        total = getattr(timeouts, "total", None)
    return total if isinstance(total, int | float) else None


def within(
    deadline: float | None,
    budget_s: float | None,
    build: Callable[[], UpstreamRequest],
    send: Callable[[UpstreamRequest], Awaitable[UpstreamResponse]],
) -> Callable[[], Awaitable[UpstreamResponse]]:
    """The flow's compute: the upstream request built when the flow calls, carrying what is
    left of `deadline` (time.monotonic()) once waits have spent part of `budget_s`."""

    async def compute() -> UpstreamResponse:
        req = build()
        if deadline is not None and budget_s is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise GatewayTimeout(
                    f"the request's {budget_s:g}s deadline passed while it waited for "
                    "another request's answer"
                )
            if left < budget_s - _SPENT_S:
                req.deadline_s = left if req.deadline_s is None else min(req.deadline_s, left)
        return await send(req)

    return compute
