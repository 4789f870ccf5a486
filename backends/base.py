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


class BodyTooLarge(Exception):
    """A replica's answer outgrew what its reader holds (`UpstreamResponse.read_capped`)."""

    def __init__(self, replica: str, limit: int) -> None:
        super().__init__(f"{replica or 'the upstream'} sent an answer over {limit} bytes")
        self.replica = replica
        self.limit = limit


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
        """The whole body, however big: for bodies already whole (`body`, a gRPC replica's
        message). A replica's streamed answer is read with `read_capped`."""
        if self.body is not None:
            return self.body
        chunks = []
        if self.stream is not None:
            async for chunk in self.stream:
                chunks.append(chunk)
        self.body = b"".join(chunks)
        self.stream = None
        return self.body

    async def read_capped(self, limit: int) -> bytes:
        """The whole body, but never more than `limit` bytes held: past it the stream is closed
        (the connection with it, not returned to the pool half-read) and BodyTooLarge raised.
        For callers that need the body whole (no streaming) from a replica that may send an
        endless or huge one: buffered with `read`, it would all be held in memory."""
        if self.body is not None:  # (the transport read a small, length-delimited body whole)
            if len(self.body) > limit:
                raise BodyTooLarge(self.replica, limit)
            return self.body
        chunks: list[bytes] = []
        size = 0
        try:
            if self.stream is not None:
                async for chunk in self.stream:
                    size += len(chunk)
                    if size > limit:
                        raise BodyTooLarge(self.replica, limit)
                    chunks.append(chunk)
        finally:
            close = getattr(self.stream, "aclose", None)
            self.stream = None
            if close is not None:
                await close()
        self.body = b"".join(chunks)
        return self.body

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
