"""A streamed answer recorded for the cache while it goes out to the leader's client, and to
identical requests that stream too (`follow`: they get its chunks as they come, not the whole
answer after its last one).

One task (the pump) reads the upstream stream into the copy and hands each chunk to every
reader (cache.live_streams.StreamReader); each client's writer takes them at its own pace. So
a client that reads slowly, or stops, holds back neither the store nor the flight's waiters nor
the other readers: the recording settles when the upstream ends. Only a reader more than `cap`
bytes behind holds the pump (backpressure, as a plain proxy would), so memory stays bounded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from backends import UpstreamResponse
from cache.asks import AnswerIncomplete, Ask
from cache.codec import CacheEntry
from cache.hit_headers import replayable
from cache.live_streams import StreamReader
from cache.policy import initial_age
from cache.route_cache import Claim
from cache.singleflight import Lead

if TYPE_CHECKING:
    from cache.flow import CacheFlow

log = logging.getLogger("latentgate.cache.recording")

_MIN_CAP = 1 << 20  # bytes a reader may fall behind before it holds the pump


class Recording:
    """A streamed answer going out to the leader's client while the flow keeps a copy.

    `start` begins reading the upstream; the writer iterates `chunks()` and always awaits
    `close()`: a complete recording is stored, indexed and handed to the flight's waiters; an
    incomplete one fails them.
    """

    def __init__(
        self,
        flow: CacheFlow,
        ask: Ask,
        up: UpstreamResponse,
        kept: list[tuple[str, str]],
        ttl: float,
        shareable: bool,
        vector: np.ndarray | None,
        lead: Lead[CacheEntry | None] | None,
        claim: Claim,
    ) -> None:
        self._flow = flow
        self._ask = ask
        self._up = up
        self._kept = kept
        self._ttl = ttl
        self._storable = ttl > 0
        self._shareable = shareable
        self._vector = vector
        self._lead = lead
        self._claim = claim
        self._copy: bytearray | None = bytearray() if self._storable or shareable else None
        self._ended = False  # the upstream stream reached its end (not cut, not abandoned)
        # The pump has handed its readers their end (whatever it was): a reader made after
        # that would never be ended, so nobody joins from then on (settling comes a step later).
        self._over = False
        # Called once the recording has settled its flight (issue 14: the semantic flight a
        # paraphrase may wait on stays announced until then).
        self.on_close: Callable[[bool], None] | None = None
        self._cap = max(flow.rc.max_entry_bytes, _MIN_CAP)
        self._readers: set[StreamReader] = set()
        self._leader = self._reader(b"")
        # Counts an upstream failure mid-stream, once (the writer sets it: gateway metrics)
        self.on_cut: Callable[[], None] | None = None
        self._pump: asyncio.Task[None] | None = None
        self._settled = False
        self._unleasing: asyncio.Task[None] | None = None
        if not shareable:
            # none of it will go to the flight's waiters (private, a Set-Cookie, an unkeyed
            # Vary): they fetch their own now, as for such an answer in one body, rather than
            # after its last byte (they lost the whole stream's time, and their budget with it)
            if lead is not None:
                lead.done(None)
            # nor to other sidecars', which the Redis lease held until then (its release at
            # settling is then a no-op: Claim.release lets go once)
            self._unleasing = asyncio.get_running_loop().create_task(claim.release())

    def start(self) -> None:
        """Begin reading the upstream (once; the leader's reader gets every chunk)."""
        if self._pump is None:
            self._pump = asyncio.get_running_loop().create_task(self._run())

    @property
    def will_share(self) -> bool:
        """Will a complete recording be stored and handed to waiters (as far as known now)?"""
        return self._storable and self._shareable and self._copy is not None

    def _let_go(self, shared: bool = True) -> None:
        """Nobody may wait on this recording any more: end what was held open for it (shared
        False: it will not be kept, so nobody should wait for its end either)."""
        done, self.on_close = self.on_close, None
        if done is not None:
            done(shared)

    @property
    def wanted(self) -> bool:
        """Does anyone but the leader's client still want the rest (waiters, followers, the
        store)?"""
        return self._copy is not None or bool(self._readers - {self._leader})

    def chunks(self) -> StreamReader:
        """The leader's client's chunks."""
        self.start()
        return self._leader

    def follow(self, answers: Any) -> UpstreamResponse | None:
        """The stream as it comes, for an identical request that streams in the same framing
        (`answers.takes_stream`): what was sent so far, then each chunk as it arrives; it ends
        as the leader's does, or is cut with it. None when it cannot be joined: another
        framing, an answer not shared (private, too large by now), or one already over."""
        if (
            self._settled
            or self._over
            or self._copy is None
            or not self._shareable
            or not answers.takes_stream(self._ask.answers)
        ):
            return None
        up = self._up
        # not the leader's request id, timing or rate-limit state (cache.hit_headers); and the
        # Age a waiter or a hit of this answer is sent (the entry's, whose resident time starts
        # at the stream's end): the follower's copy, too, was not made for its request
        age = initial_age(up.headers, self._ask.response_delay)
        return UpstreamResponse(
            up.status,
            up.reason,
            [*_without_age(replayable(up.headers, up.status)), ("Age", str(int(age)))],
            stream=self._reader(bytes(self._copy)),
            replica=up.replica,
            deadline=up.deadline,
        )

    def _reader(self, head: bytes) -> StreamReader:
        reader = StreamReader(head, self._reader_done, self._cap)
        self._readers.add(reader)
        return reader

    def _reader_done(self, reader: StreamReader) -> None:
        self._readers.discard(reader)
        pump = self._pump
        if (
            pump is not None
            and not pump.done()
            and not self._readers
            and self._copy is None
            and not self._settled  # (settling: its lease release must not be cut short)
        ):
            pump.cancel()  # nobody reads on and nothing is kept: free the upstream

    async def _run(self) -> None:
        """Read the upstream to its end (or the route's total), keeping the copy and handing
        each chunk to the readers; then settle: store, answer the flight, end the readers."""
        assert self._up.stream is not None
        limit = self._flow.rc.max_entry_bytes
        deadline = self._up.deadline
        why = "abandoned"
        try:
            async with asyncio.timeout(None if deadline is None else deadline - time.monotonic()):
                async for chunk in self._up.stream:
                    copy = self._copy
                    if copy is not None:
                        copy += chunk
                        if len(copy) > limit:
                            self._outgrown()
                    if not self._readers and self._copy is None:
                        return  # nobody reads on and nothing is kept: free the upstream
                    for reader in tuple(self._readers):
                        reader.put(chunk)
                    await self._keep_pace()
            self._ended = True
        except TimeoutError:
            why = "past the route's total timeout"
            self._cut(why)
        except Exception as exc:  # an upstream read error: the readers are cut with it
            why = str(exc) or type(exc).__name__
            self._cut(why)
        finally:
            self._over = True
            for reader in tuple(self._readers):
                reader.error = why
                reader.put(self._ended)
            await asyncio.shield(self._settle())  # (a cancel mid-way must not skip a release)

    def _cut(self, why: str) -> None:
        log.warning("upstream stream cut mid-way: %s", why)
        if self.on_cut is not None:
            self.on_cut()

    async def _keep_pace(self) -> None:
        """A reader more than `cap` behind (by then the answer has outgrown the store): alone,
        it holds the pump, as a plain proxy's client would; beside others it is cut, so one
        client's pace never holds back another's."""
        for reader in tuple(self._readers):
            if reader.room.is_set():
                continue
            if len(self._readers) > 1:
                reader.error = "this client fell too far behind the stream"
                reader.put(False)
                self._readers.discard(reader)
            else:
                await reader.room.wait()

    def _outgrown(self) -> None:
        """The answer outgrew max_entry_bytes: nothing is kept, the flight's waiters and
        paraphrases compute now instead of waiting for its end; its readers read on."""
        self._copy, self._storable, self._shareable = None, False, False
        self._let_go(shared=False)
        self._flow.live.closed(self._ask.key.value, self)
        if self._lead is not None:
            self._lead.done(None)

    async def close(self) -> None:
        """The leader's writer is done: wait while the rest is still wanted (the store, the
        flight's waiters, followers), else stop reading the upstream."""
        await self._leader.aclose()
        self.start()  # (a writer that never iterated: the recording still settles)
        assert self._pump is not None
        if not self.wanted and not self._settled:
            self._pump.cancel()
        try:
            await asyncio.shield(self._pump)
        except asyncio.CancelledError:
            if not self._pump.cancelled():
                raise  # this writer was cancelled; the pump goes on for the others
        except Exception:  # (the pump settles its own failures)
            log.debug("recording pump failed", exc_info=True)
        await self._settle()  # (a pump cancelled before it ran never settled)

    async def _settle(self) -> None:
        if self._settled:
            return
        self._settled = True
        self._flow.live.closed(self._ask.key.value, self)
        try:
            if self._up.stream is not None:
                await self._up.stream.aclose()  # type: ignore[attr-defined]
            entry = self._seal() if self._ended else None
            if entry is None:
                if self._lead is not None:
                    if self._copy is None or self._ended:
                        # nothing shareable was kept (private or too large), or the stream
                        # ran to its end but is not one the cache keeps (an error event in
                        # it): waiters fetch their own answers rather than fail
                        self._lead.done(None)
                    else:
                        self._lead.fail(
                            AnswerIncomplete("upstream stream ended before it completed")
                        )
                return
            entry.reusable = self._storable
            if self._lead is not None:
                self._lead.done(entry if self._shareable else None)
            if self._storable:
                await self._flow._store(self._ask, entry, self._vector)
        finally:
            if self._lead is not None and self._lead.open:
                self._lead.abandon()
            self._let_go()
            await self._claim.release()

    def _seal(self) -> CacheEntry | None:
        if self._copy is None:
            return None
        up, ask = self._up, self._ask
        sealed = ask.answers.seal(up.header("Content-Type") or "", bytes(self._copy))
        if sealed is None:
            return None
        rc = self._flow.rc
        ttl = self._ttl or rc.policy.ttl  # (an entry not stored still goes to waiters)
        answer = {"events": sealed} if isinstance(sealed, list) else {"body": sealed}
        return rc.entry(
            up.status,
            self._kept,
            model=ask.call.model,
            kind=ask.kind,
            ttl=ttl,
            age=initial_age(up.headers, ask.response_delay),
            **answer,
        )


def _without_age(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers if k.lower() != "age"]
