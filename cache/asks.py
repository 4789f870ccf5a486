"""What a cached call hands to the flow and gets back: plain data, no behaviour.

`Ask` is built by the edge (HTTP pipeline, gRPC service) from what it parsed; `Hit` and `Fresh`
are what the flow answers; `Clock` and `Answers` are what the flow asks of the edge.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from backends import UpstreamError, UpstreamResponse
from cache.codec import CacheEntry
from cache.keys import CacheKey
from cache.policy import RequestDirectives
from cache.semantic.records import Candidate, SemanticHit
from cache.semantic.route import CallLike

if TYPE_CHECKING:
    from cache.recording import Recording


class Clock(Protocol):
    """Where the flow records its stages (the gateway's Server-Timing)."""

    def add(self, name: str, since: float) -> float: ...


class Answers(Protocol):
    """The protocol's rules for answers, as the flow needs them (supplied per request)."""

    def serves(self, entry: CacheEntry) -> bool:
        """May this request be answered from `entry` (e.g. its framing can be rendered)?"""
        ...

    def seal(self, content_type: str, data: bytes) -> bytes | list[bytes] | None:
        """A finished recording as an entry's body (bytes) or events (list); None when the
        stream did not complete, so it is never stored or shared. A whole body the cache would
        store is checked by it too (None: not kept, not shared)."""
        ...

    def keeps(self, content_type: str) -> bool:
        """Is a 2xx of this Content-Type the kind of answer the route serves, so that it may be
        stored and shared? (False: the asking client gets it once; nobody else does.)"""
        ...

    def follows_stream(self, leader: Any) -> bool:
        """May this request wait out another request's streamed answer (`leader`: that
        request's Answers)? Not when it streams itself (its first token would come only after
        the other's last), nor when the recorded stream cannot be rendered for it."""
        ...

    def takes_stream(self, leader: Any) -> bool:
        """May this request be sent an identical request's stream as it comes, byte for byte
        (`leader`: that request's Answers)? Only when it streams too, in the same framing."""
        ...


class AnswerIncomplete(UpstreamError):
    """The leader's stream ended or broke before it completed; waiters get this."""


@dataclass(slots=True)
class Ask:
    key: CacheKey
    directives: RequestDirectives
    call: CallLike
    kind: str
    answers: Answers
    clock: Clock
    compute_stage: str = "upstream"  # the Server-Timing name of the backend's time
    skipped: str = ""  # set by the flow: why the semantic stage passed this call by
    # issue 14: the best candidate the semantic lookup did not serve; the fresh answer labels it
    semantic_candidate: Candidate | None = None
    # stored questions that contest a paraphrase in flight (None: the lookup did not finish,
    # so no flight is joined)
    semantic_rivals: int | None = None
    # the lookup missed and left its count to the flow: a miss, or a hit if a paraphrase in
    # flight serves this request (cache.semantic.flow_hooks.flight_hit)
    semantic_missed: bool = False
    # The route's upstream total (None: none): time spent waiting for another request's answer
    # (a flight, a paraphrase's flight, another gateway's lease) comes off it, so a fruitless
    # wait does not add a whole total to the client's wait. Only waits count: reading the body,
    # parsing and the semantic lookup do not.
    budget_s: float | None = None
    waited_s: float = 0.0
    # set by the flow: from sending the call upstream to its answer's headers (retries and
    # queueing in the pool included), which its age counts (RFC 9111 4.2.3: response_delay)
    response_delay: float = 0.0

    def wait_s(self, most: float, share: float = 1.0) -> float:
        """How long this request may wait for another's answer: `most`, or less when `share` of
        its budget, less what it already waited, is less (never below 0)."""
        if self.budget_s is None:
            return most
        return max(0.0, min(most, share * self.budget_s - self.waited_s))

    def left_s(self) -> float | None:
        """What its waits left of its budget (None: no budget)."""
        return None if self.budget_s is None else self.budget_s - self.waited_s

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        t = time.monotonic()
        try:
            yield
        finally:
            self.waited_s += time.monotonic() - t


@dataclass(slots=True)
class Hit:
    """Served from the cache (or from the leader of the flight this request waited on)."""

    entry: CacheEntry
    x_cache: str  # hit | semantic-hit | miss (a waiter's share of the leader's answer)
    semantic: SemanticHit | None = None


@dataclass(slots=True)
class Fresh:
    """The backend's own answer, going out now. A stream comes with its `recording`, which
    the writer iterates instead of the raw stream and must close."""

    response: UpstreamResponse
    x_cache: str
    recording: Recording | None = None
    reason: str = ""  # why a bypass did not use the cache (sampled, no-store, no-cache)
    semantic_skip: str = ""  # why the semantic stage did not look this call up (too_long)


Result = Hit | Fresh
