"""One generation of what a config reload swaps: the router (routes and policies), the backends
and the route caches (their keys and policies).

A request pins the generation it started on, so a reload never changes anything under it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

from backends import Backend
from cache import Flows
from gateway.routing import Router


@dataclass(eq=False)
class Runtime:
    router: Router
    backends: Mapping[str, Backend]
    generation: int = 0
    # with the routes: a call's answer is keyed and stored by the policy its route was read
    # under, never by one a reload put in place while its body was still arriving
    flows: Flows = field(default_factory=Flows)
    in_flight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()

    def enter(self) -> None:
        self.in_flight += 1
        self.idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.idle.set()
