"""Transport protocol: bytes to one replica over a pooled connection. Policy lives in the Pool."""

from __future__ import annotations

from typing import Protocol

from backends.base import UpstreamRequest, UpstreamResponse


class Transport(Protocol):
    url: str

    async def send(
        self,
        request: UpstreamRequest,
        *,
        connect_s: float | None = None,
        deadline_s: float | None = None,
    ) -> UpstreamResponse: ...

    def connections_in_use(self) -> int: ...

    def pool_stats(self) -> dict[str, int]: ...

    @property
    def closed(self) -> bool:
        """aclose() was called (a reload closes a replaced pool once it has drained)."""
        ...

    async def aclose(self) -> None: ...
