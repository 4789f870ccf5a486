"""Identical streaming requests follow a leader's stream live.

An identical request that arrives while the leader's answer is on its way waits on the leader's
flight. When that answer turns out to be a stream the waiter takes as it is (it streams too, in
the same framing: `Answers.takes_stream`), the waiter is sent the stream as it comes
(`Recording.follow`): its first token then arrives with the leader's, not after the leader's
last. Everything else still waits for the whole answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from backends import UpstreamError, UpstreamResponse
from cache.codec import CacheEntry

if TYPE_CHECKING:
    from cache.recording import Recording


class LiveStreams:
    """Per route: streams in flight by exact key, and the waiters to tell when a leader's
    answer turns out to be one. One event loop."""

    def __init__(self) -> None:
        self._live: dict[str, Recording] = {}
        self._turns: dict[str, list[asyncio.Future[Recording | None]]] = {}

    def started(self, key: str, recording: Recording | None) -> None:
        """The leader's answer is in (None) or streaming: tell the waiters, and let later ones
        find the stream until it closes."""
        if recording is not None:
            self._live[key] = recording
        for turn in self._turns.pop(key, ()):
            if not turn.done():
                turn.set_result(recording)

    def closed(self, key: str, recording: Recording) -> None:
        if self._live.get(key) is recording:
            del self._live[key]

    async def wait(
        self, key: str, answer: Awaitable[CacheEntry | None], answers: Any
    ) -> CacheEntry | UpstreamResponse | None:
        """`answer` (the flight's), or the leader's stream as it comes when this request takes
        it (`answers`: its Answers)."""
        waiting = asyncio.ensure_future(answer)
        live = self._live.get(key)
        followed = live.follow(answers) if live is not None else None
        if followed is not None:
            waiting.cancel()
            return followed
        turn: asyncio.Future[Recording | None] = asyncio.get_running_loop().create_future()
        turns = self._turns.setdefault(key, [])
        turns.append(turn)
        try:
            either: set[asyncio.Future[Any]] = {waiting, turn}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            streaming = turn.result() if turn.done() else None
            if not waiting.done() and streaming is not None:
                followed = streaming.follow(answers)
                if followed is not None:
                    return followed
            return await waiting
        finally:
            if turn in turns:
                turns.remove(turn)
                if not turns and self._turns.get(key) is turns:
                    del self._turns[key]
            turn.cancel()
            waiting.cancel()
            if waiting.done() and not waiting.cancelled():
                waiting.exception()  # retrieved: a result this request left is not an error


class StreamCut(UpstreamError):
    """A recorded stream's reader was cut: the upstream failed (logged and counted once, by
    the recording) or this client fell too far behind the others."""


class StreamReader:
    """One client's copy of a recorded stream: the leader's writer or a follower's. The
    recording's pump hands it each chunk; it yields them at its client's pace. A bool ends it:
    True at the stream's end, False cut. `aclose` unregisters it even if never iterated."""

    def __init__(self, head: bytes, on_done: Callable[[StreamReader], None], cap: int) -> None:
        self._queue: asyncio.Queue[bytes | bool] = asyncio.Queue()
        if head:
            self._queue.put_nowait(head)
        self.backlog = len(head)  # bytes handed to it and not yet taken
        self._cap = cap
        self._on_done: Callable[[StreamReader], None] | None = on_done
        self.room = asyncio.Event()  # set while its backlog is within the cap
        self.room.set()
        self.error = "abandoned"  # why it was cut (the upstream's failure, or its own lag)

    def put(self, item: bytes | bool) -> None:
        if isinstance(item, bytes):
            self.backlog += len(item)
            if self.backlog > self._cap:
                self.room.clear()
        self._queue.put_nowait(item)

    def __aiter__(self) -> StreamReader:
        return self

    async def __anext__(self) -> bytes:
        if self._on_done is None:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, bool):
            self._done()
            if not item:
                raise StreamCut(self.error)
            raise StopAsyncIteration
        self.backlog -= len(item)
        if self.backlog <= self._cap:
            self.room.set()
        return item

    async def aclose(self) -> None:
        self._done()

    def _done(self) -> None:
        done, self._on_done = self._on_done, None
        self.room.set()
        if done is not None:
            done(self)
