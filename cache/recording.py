"""A streamed answer recorded for the cache while it goes out to the leader's client, and to
identical requests that stream too (`follow`: they get its chunks as they come, not the whole
answer after its last one)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from backends import UpstreamError, UpstreamResponse
from cache.asks import AnswerIncomplete, Ask
from cache.cache import Claim
from cache.codec import CacheEntry
from cache.policy import received_age
from cache.singleflight import Lead

if TYPE_CHECKING:
    from cache.flow import CacheFlow


class Recording:
    """A streamed answer going out to the leader's client while the flow keeps a copy.

    The writer iterates `chunks()` and always awaits `close()`: a complete recording is
    stored, indexed and handed to the flight's waiters; an incomplete one fails them.
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
        # Called once the recording has settled its flight (issue 14: the semantic flight a
        # paraphrase may wait on stays announced until then).
        self.on_close: Callable[[bool], None] | None = None
        # Identical streaming requests following the stream live: each gets every chunk from
        # its join on (after what came before it), then None at the end or the error that cut
        # it. Unbounded per follower, but a stream is bounded by the route's total.
        self._followers: set[asyncio.Queue[bytes | bool]] = set()
        self._closed = False

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
        return self._copy is not None or bool(self._followers)

    def follow(self, answers: Any) -> UpstreamResponse | None:
        """The stream as it comes, for an identical request that streams in the same framing
        (`answers.takes_stream`): what was sent so far, then each chunk as it arrives; it ends
        as the leader's does, or is cut with it. None when it cannot be joined: another
        framing, an answer not shared (private, too large by now), or one already over."""
        if (
            self._closed
            or self._ended
            or self._copy is None
            or not self._shareable
            or not answers.takes_stream(self._ask.answers)
        ):
            return None
        queue: asyncio.Queue[bytes | bool] = asyncio.Queue()
        self._followers.add(queue)
        up = self._up
        return UpstreamResponse(
            up.status,
            up.reason,
            list(up.headers),
            stream=self._follower(bytes(self._copy), queue),
            replica=up.replica,
            deadline=up.deadline,
        )

    async def _follower(
        self, head: bytes, queue: asyncio.Queue[bytes | bool]
    ) -> AsyncIterator[bytes]:
        """A follower's chunks; a bool ends them: True at the stream's end, False cut."""
        try:
            if head:
                yield head
            while not isinstance(item := await queue.get(), bool):
                yield item
            if not item:
                raise UpstreamError("the stream this request followed was cut")
        finally:
            self._followers.discard(queue)

    def _tell(self, item: bytes | bool) -> None:
        for queue in self._followers:
            queue.put_nowait(item)

    async def chunks(self) -> AsyncIterator[bytes]:
        assert self._up.stream is not None
        limit = self._flow.rc.max_entry_bytes
        try:
            async for chunk in self._up.stream:
                copy = self._copy
                if copy is not None:
                    copy += chunk
                    if len(copy) > limit:
                        self._copy, self._storable, self._shareable = None, False, False
                        self._let_go(shared=False)
                self._tell(chunk)
                yield chunk
            self._ended = True
        finally:
            # followers end as the leader's client does: at the end, or cut (an upstream
            # error, the route's total, or the writer stopping)
            self._tell(self._ended)

    async def close(self) -> None:
        self._closed = True
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
            age=received_age(up.headers),
            **answer,
        )
