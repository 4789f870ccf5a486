"""The Backend contract: one upstream request in, one (possibly streamed) response out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from backends.settings import RoutePolicy

Headers = list[tuple[str, str]]
# A gRPC replica's non-OK status rides on an UpstreamResponse in these headers (code number,
# message), so the gateway can answer its client with the upstream's own status.
GRPC_STATUS_HEADER = "grpc-status"
GRPC_MESSAGE_HEADER = "grpc-message"


@dataclass(slots=True)
class UpstreamRequest:
    method: str
    path_qs: str
    headers: Headers
    # bytes when the gateway parsed the body; an async iterator when it streams it through.
    body: bytes | AsyncIterator[bytes] | None = None
    content_length: int | None = None
    # Seconds left in the client's deadline; sent upstream so replicas can shed late work.
    deadline_s: float | None = None
    # The route's retry, hedge and timeout policy; local engines ignore it.
    policy: RoutePolicy | None = None


@dataclass(slots=True)
class UpstreamResponse:
    status: int
    reason: str
    headers: Headers
    # The whole body when it was small and length-delimited; otherwise `stream` yields chunks.
    body: bytes | None = None
    stream: AsyncIterator[bytes] | None = None
    replica: str = ""
    # when a streamed body must have ended (time.monotonic(); the route's total): a client
    # that stops reading cannot hold the replica's stream past it
    deadline: float | None = None
    _release: list[object] = field(default_factory=list)

    async def read(self) -> bytes:
        if self.body is not None:
            return self.body
        chunks = []
        if self.stream is not None:
            async for chunk in self.stream:
                chunks.append(chunk)
        self.body = b"".join(chunks)
        self.stream = None
        return self.body

    async def read_whole(self) -> bytes:
        """`read`, and the stream released whatever happens (a read that fails half-way must
        not keep its connection and in-flight slot): for callers that want the body only."""
        try:
            return await self.read()
        finally:
            close = getattr(self.stream, "aclose", None)
            if close is not None:
                await close()

    def header(self, name: str) -> str | None:
        lname = name.lower()
        for k, v in self.headers:
            if k.lower() == lname:
                return v
        return None


class Backend(Protocol):
    name: str
    # What its time is called in Server-Timing: "upstream" for replicas, "engine" for local models.
    timing_stage: str

    async def send(self, request: UpstreamRequest) -> UpstreamResponse: ...

    def ready(self) -> bool: ...

    def describe(self) -> dict[str, object]: ...

    async def aclose(self) -> None: ...
