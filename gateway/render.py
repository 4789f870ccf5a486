"""Cached entries as HTTP bodies: the framing a request asked for (SSE or one JSON body, with or
without the usage chunk), converted once per entry and framing and memoised on the entry.

`Framing` is also what the cache flow asks of a protocol's answers (`cache.asks.Answers`):
whether an entry can serve this request, and how a recorded stream becomes an entry.
"""

from __future__ import annotations

import json
from typing import NamedTuple, cast

import orjson

from backends import MSGPACK_TYPES
from cache import CacheEntry, replayable
from gateway.protocols import obfuscation, openai_sse
from gateway.protocols.base import Call
from gateway.protocols.stream_codecs import completion_check, convertible

SSE = "text/event-stream"
_OPENAI_KINDS = frozenset({"chat", "completions"})
_JSON_KINDS = frozenset({"chat", "completions", "embeddings", "messages"})

Rendered = tuple[bytes, list[tuple[str, str]]]

# The media types a 2xx of each kind may have to be stored and shared: a JSON API answers JSON
# (or msgpack, which the gateway reads as the same documents), or an event stream where the
# call streams; a v2 infer answer is JSON or the binary tensor extension's octet stream. Any
# other (a captive portal's text/html login page, a file server's text/plain) goes to the
# client that asked, once; a kind not named here (passthrough: "raw") keeps any type.
_JSON_TYPES = frozenset({"application/json"}) | MSGPACK_TYPES
_ANSWER_TYPES: dict[str, frozenset[str]] = {
    "chat": _JSON_TYPES | {SSE},
    "completions": _JSON_TYPES | {SSE},
    "messages": _JSON_TYPES | {SSE},
    "embeddings": _JSON_TYPES,
    "infer": _JSON_TYPES | {"application/octet-stream"},
}


def answer_type_fits(kind: str, content_type: str) -> bool:
    """May a 2xx with this Content-Type answer calls of this kind for anyone but the client
    it came to?"""
    types = _ANSWER_TYPES.get(kind)
    if types is None:
        return True
    media = content_type.partition(";")[0].strip().lower()
    return media in types or media.endswith("+json")


def _content_type(entry: CacheEntry) -> str:
    for k, v in entry.headers:
        if k.lower() == "content-type":
            return v
    return ""


class Framing(NamedTuple):
    """What a response's shape depends on beyond the entry: stream or not, usage chunk or not.
    (A tuple: it keys the entry's memo on every hit, and a tuple hashes in C.)"""

    stream: bool = False
    include_usage: bool = False
    kind: str = ""  # the call's kind: which stream codec says a recorded stream completed
    # vLLM's stream_options.continuous_usage_stats: usage on every chunk. Such a call's options
    # are in its key, so its entry is a stream recorded for the same options: replayed as it
    # came, never made from a stored body (which has no per-chunk usage to give)
    continuous_usage: bool = False
    # OpenAI's stream_options.include_obfuscation (on unless false): a stored stream's padding
    # is drawn afresh for each replay, or dropped (gateway/protocols/obfuscation.py)
    obfuscation: bool = True

    def follows_stream(self, leader: object) -> bool:
        """A one-body request may wait out a streamed answer it can be rendered from: an
        OpenAI stream makes a JSON body only with its usage chunk (_render). A streaming one
        does not wait: its first token would come after the other's last."""
        if self.stream or not isinstance(leader, Framing):
            return False
        return leader.include_usage or self.kind not in _OPENAI_KINDS

    def takes_stream(self, leader: object) -> bool:
        """A streaming request may follow an identical one's stream live when it would render
        a recording of it unchanged: both stream, with the same usage chunk or none, and the
        leader's stream has no padding this request refused (one that asked for no padding
        waits for the whole answer, unless its leader asked for none too)."""
        if not self.stream or not isinstance(leader, Framing):
            return False
        padding_ok = self.obfuscation or not leader.obfuscation
        return padding_ok and leader._replace(obfuscation=True) == self._replace(obfuscation=True)

    def serves(self, entry: CacheEntry) -> bool:
        return rendered(entry, self) is not None

    def keeps(self, content_type: str) -> bool:
        return answer_type_fits(self.kind, content_type)

    def seal(self, content_type: str, data: bytes) -> bytes | list[bytes] | None:
        if SSE not in content_type:
            # a JSON API's answer read to the close (no length, not chunked) is whole only if
            # it parses: a connection cut mid-body looks like its end, and the cut answer,
            # once stored, failed every later client's SDK until the TTL
            if self.kind in _JSON_KINDS and "json" in content_type and not _parses(data):
                return None
            return data
        events = openai_sse.split_events(data)
        return events if completion_check(self.kind).completed(events) else None


def _parses(data: bytes) -> bool:
    """Does the answer parse as the clients' json.loads reads it? Checked on the event loop for
    every stored miss: json.loads held it for a median 29.7 ms on a 2 MB embeddings answer (64
    vectors of 1,536; every other request waited), orjson 3.2 ms in the same run. orjson
    refuses what json.loads takes beside JSON proper (NaN, a lone surrogate's escape): those
    few are asked again of json.loads, so the verdict is the same."""
    try:
        orjson.loads(data)
    except orjson.JSONDecodeError:
        try:
            json.loads(data)
        # JSONDecodeError and UnicodeDecodeError both; RecursionError for nesting past orjson's
        # 1,024 levels, which json.loads cannot read either (it escaped to the pipeline as the
        # client's "request body is nested too deeply", the flight it led never settled)
        except (ValueError, RecursionError):
            return False
    return True


def framing_of(call: Call) -> Framing:
    return Framing(
        call.stream,
        bool(call.extra.get("include_usage")),
        call.kind,
        bool(call.extra.get("continuous_usage")),
        call.extra.get("obfuscation") is not False,
    )


def rendered(entry: CacheEntry, framing: Framing) -> Rendered | None:
    """The entry's body and headers in this framing; None when it cannot be converted."""
    out = entry.memo.get(framing)
    if out is None:
        out = entry.memo[framing] = _render(entry, framing) or False
    return None if out is False else cast(Rendered, out)


def repadded(entry: CacheEntry, framing: Framing) -> Rendered | None:
    """This replay's own body when the entry's OpenAI stream carries obfuscation padding and the
    client did not refuse it: the same chunks with fresh padding. None: the rendered body as is."""
    if not (framing.stream and framing.obfuscation and entry.events is not None):
        return None
    if framing.kind not in _OPENAI_KINDS:
        return None
    key = ("padding", framing)
    tpl = entry.memo.get(key)
    if tpl is None:
        out = rendered(entry, framing)
        made = obfuscation.template(openai_sse.split_events(out[0])) if out else None
        tpl = entry.memo[key] = made or False
    if tpl is False:
        return None
    out = rendered(entry, framing)
    assert out is not None
    return obfuscation.filled(cast(obfuscation.Template, tpl)), out[1]


def _render(entry: CacheEntry, framing: Framing) -> Rendered | None:
    """Body and headers of the entry in the call's framing (computed once per entry and framing);
    None when this framing cannot be served from it.

    Usage follows each client's `stream_options`: a streaming client that did not ask for usage
    never gets the usage chunk; one that asked, or a client wanting one JSON body (which always
    carries usage), is not served from an entry without usage: that is a miss, whose answer
    completes the entry.
    """
    if not answer_type_fits(entry.kind, _content_type(entry)):
        return None  # (stored by a sidecar of an older version: never replayed)
    stream, include_usage = framing.stream, framing.include_usage
    body: bytes | None
    ctype: str | None = None
    codec = convertible(entry.kind)  # per kind: openai_sse for chat/completions, anthropic_sse
    usage_rules = entry.kind in _OPENAI_KINDS
    if framing.continuous_usage and framing.kind in _OPENAI_KINDS:
        # usage on every chunk: keyed with its options, so replayed as recorded (never made
        # from a stored body, which has no per-chunk usage to give)
        if entry.events is None:
            return None
        events = entry.events if framing.obfuscation else obfuscation.stripped(entry.events)
        body = openai_sse.join_events(events)
    elif entry.events is not None:
        if stream or codec is None:
            events = entry.events
            if usage_rules and stream:
                if include_usage and not openai_sse.has_usage(events):
                    return None
                if not include_usage:
                    events = openai_sse.without_usage(events)
                if not framing.obfuscation:
                    events = obfuscation.stripped(events)
            body = openai_sse.join_events(events)
        else:
            if usage_rules and not openai_sse.has_usage(entry.events):
                return None
            body, ctype = codec.events_to_body(entry.events, entry.kind), "application/json"
    else:
        body = entry.body
        if stream and codec is not None and "json" in _content_type(entry):
            assert entry.body is not None
            if usage_rules and include_usage and not openai_sse.body_has_usage(entry.body):
                return None
            converted = codec.body_to_events(entry.body, entry.kind, include_usage)
            body, ctype = (openai_sse.join_events(converted) if converted else None), SSE
    if body is None:
        return None
    # (entries stored before these were dropped at store time still hold the upstream's
    # request id, timing and rate-limit state: never replayed, whatever the hit path)
    headers = replayable(entry.headers, entry.status)
    if ctype is not None:
        drop = {"content-type", "cache-control"}
        headers = [(k, v) for k, v in headers if k.lower() not in drop]
        headers.append(("Content-Type", ctype))
        if ctype == SSE:
            headers.append(("Cache-Control", "no-cache"))
    return body, headers
