"""Which stream framing a call kind uses: the per-kind table the exact cache's tee and renderer
consult to check a stream for completeness and to convert between SSE and one JSON body.
Chat and completions streams are whole on [DONE] with no error event and every choice
finished; Messages API streams on message_stop; other SSE (a passthrough route's) on [DONE]."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gateway.protocols import anthropic_sse, openai_sse


@dataclass(frozen=True, slots=True)
class StreamCodec:
    completed: Callable[[list[bytes]], bool]
    events_to_body: Callable[[list[bytes], str], bytes | None]
    body_to_events: Callable[[bytes, str, bool], list[bytes] | None]
    end: str  # the terminating event, named in errors about cut streams


OPENAI = StreamCodec(
    openai_sse.completed, openai_sse.events_to_body, openai_sse.body_to_events, "[DONE]"
)
ANTHROPIC = StreamCodec(
    anthropic_sse.completed,
    anthropic_sse.events_to_body,
    anthropic_sse.body_to_events,
    anthropic_sse.STOP,
)
# Kinds whose stored answers convert between a stream and one JSON body.
_CONVERTIBLE = {"chat": OPENAI, "completions": OPENAI, "messages": ANTHROPIC}


def convertible(kind: str) -> StreamCodec | None:
    """The codec that converts this kind's answers, or None when they replay only as stored."""
    return _CONVERTIBLE.get(kind)


# A stream the gateway does not parse (a passthrough route's SSE): whole when it ends in [DONE].
RAW = StreamCodec(
    openai_sse.ends_done, openai_sse.events_to_body, openai_sse.body_to_events, "[DONE]"
)


def completion_check(kind: str) -> StreamCodec:
    """The codec whose `completed` decides whether a tee'd stream of this kind may be stored
    (other kinds: SSE that ends in [DONE], nothing more)."""
    return _CONVERTIBLE.get(kind, RAW)
