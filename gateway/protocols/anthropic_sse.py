"""Anthropic stream framing: Messages API SSE events ⇄ one JSON `message`.

A stream is complete once `message_stop` arrived. A stored stream becomes the `message` a
non-streaming client expects, and a stored message becomes the event sequence the SDK's
`messages.stream()` accumulates back into the same message: message_start, per content block
start / delta / stop, message_delta (stop reason, output tokens), message_stop.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.protocols.openai_sse import join_events, split_events

__all__ = ["body_to_events", "completed", "events_to_body", "join_events", "split_events"]

STOP = "message_stop"


def _payload(event: bytes) -> dict[str, Any] | None:
    data = [line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")]
    if not data:
        return None
    doc = json.loads(b"\n".join(data))
    return doc if isinstance(doc, dict) else None


def _type(event: bytes) -> str | None:
    for line in event.split(b"\n"):
        if line.startswith(b"event:"):
            return line[6:].strip().decode("utf-8", "replace")
    try:
        doc = _payload(event)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    kind = doc.get("type") if doc is not None else None
    return kind if isinstance(kind, str) else None


def completed(events: list[bytes]) -> bool:
    """The stream ended with message_stop (an `error` event or a cut never does)."""
    return bool(events) and _type(events[-1]) == STOP


def _apply_delta(block: dict[str, Any], delta: dict[str, Any], json_buf: list[str]) -> None:
    """One content_block_delta onto its block; tool input JSON is collected, parsed at the end.
    A delta of a type it does not know raises: its block would be built without it."""
    kind = delta.get("type")
    if kind == "text_delta":
        block["text"] = block.get("text", "") + delta.get("text", "")
    elif kind == "input_json_delta":
        json_buf.append(delta.get("partial_json", ""))
    elif kind == "thinking_delta":
        block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
    elif kind == "signature_delta":
        block["signature"] = delta.get("signature", "")
    elif kind == "citations_delta":
        block.setdefault("citations", None)
        block["citations"] = [*(block["citations"] or []), delta.get("citation")]
    elif kind == "compaction_delta":  # (beta) the summary and its opaque state, said whole
        block["content"] = delta.get("content")
        block["encrypted_content"] = delta.get("encrypted_content")
    else:  # a delta this gateway does not know: the block it builds is not the API's
        raise ValueError(f"unknown delta type {kind!r}")


def events_to_body(events: list[bytes], kind: str = "messages") -> bytes | None:
    """The single `message` equivalent to a finished stream, or None when it cannot be built."""
    try:
        return _build(events)
    except (ValueError, TypeError, AttributeError, IndexError, KeyError):
        return None  # a stream shaped otherwise than the API's: replayed only as it came


def _build(events: list[bytes]) -> bytes | None:
    payloads = [p for p in (_payload(e) for e in events) if p is not None]
    message: dict[str, Any] | None = None
    json_bufs: dict[int, list[str]] = {}
    for p in payloads:
        kind_ = p.get("type")
        if kind_ == "message_start" and isinstance(p.get("message"), dict):
            message = {**p["message"], "content": list(p["message"].get("content") or [])}
            continue
        if message is None:
            continue  # ping before message_start, or a malformed stream: nothing to attach to
        index = p.get("index", 0)
        if kind_ == "content_block_start":
            message["content"].append(dict(p.get("content_block") or {}))
        elif kind_ == "content_block_delta" and 0 <= index < len(message["content"]):
            delta = p.get("delta") or {}
            buf = json_bufs.setdefault(index, []) if delta.get("type") == "input_json_delta" else []
            _apply_delta(message["content"][index], delta, buf)
        elif kind_ == "message_delta":
            delta = p.get("delta") or {}
            for field in ("stop_reason", "stop_sequence", "stop_details", "container"):
                if field in delta:
                    message[field] = delta[field]
            for field in ("context_management", "input_transformations"):  # (beta)
                if p.get(field) is not None:
                    message[field] = p[field]
            usage = {k: v for k, v in (p.get("usage") or {}).items() if v is not None}
            message["usage"] = {**(message.get("usage") or {}), **usage}
    if message is None:
        return None
    for index, parts in json_bufs.items():
        raw = "".join(parts)
        message["content"][index]["input"] = json.loads(raw) if raw else {}
    return json.dumps(message).encode()


def _event(kind: str, doc: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: ".encode() + json.dumps({"type": kind, **doc}).encode()


# Blocks whose input the API streams as input_json_delta (the SDK's TRACKS_TOOL_INPUT).
_TOOL_INPUT_BLOCKS = frozenset({"tool_use", "server_tool_use", "mcp_tool_use"})


def _block_events(index: int, block: dict[str, Any]) -> list[bytes]:
    """content_block_start, its deltas, content_block_stop: what the API streams per block.
    What the API streams as deltas goes as deltas, not in the start: stream readers (the SDK's
    `citation` and `input_json` events, tracing and agent frameworks) read them there."""
    kind = block.get("type")
    start, deltas = dict(block), []
    if kind == "text":
        start["text"] = ""
        if block.get("text"):
            deltas.append({"type": "text_delta", "text": block["text"]})
        citations = block.get("citations")
        if isinstance(citations, list) and citations:
            start["citations"] = []
            deltas += [{"type": "citations_delta", "citation": c} for c in citations]
    elif kind in _TOOL_INPUT_BLOCKS:
        start["input"] = {}
        deltas.append({"type": "input_json_delta", "partial_json": json.dumps(block.get("input"))})
    elif kind == "thinking":
        start["thinking"], start["signature"] = "", ""
        if block.get("thinking"):
            deltas.append({"type": "thinking_delta", "thinking": block["thinking"]})
        if block.get("signature"):
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
    # other block types (redacted thinking, server tool results) arrive whole in their start
    out = [_event("content_block_start", {"index": index, "content_block": start})]
    out += [_event("content_block_delta", {"index": index, "delta": d}) for d in deltas]
    out.append(_event("content_block_stop", {"index": index}))
    return out


def body_to_events(
    body: bytes, kind: str = "messages", include_usage: bool = False
) -> list[bytes] | None:
    """The stream equivalent to a stored `message` (ending in message_stop), or None."""
    try:
        doc = json.loads(body)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError both
        return None
    if not isinstance(doc, dict) or doc.get("type") != "message":
        return None
    content = doc.get("content")
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        return None
    usage = doc.get("usage")
    output_tokens = usage.get("output_tokens", 0) if isinstance(usage, dict) else 0
    start = {**doc, "content": [], "stop_reason": None, "stop_sequence": None}
    events = [_event("message_start", {"message": start})]
    for i, block in enumerate(content):
        events += _block_events(i, block)
    final_usage = {"output_tokens": output_tokens}
    delta = {"stop_reason": doc.get("stop_reason"), "stop_sequence": doc.get("stop_sequence")}
    delta.update({k: doc[k] for k in ("stop_details", "container") if k in doc})
    events.append(_event("message_delta", {"delta": delta, "usage": final_usage}))
    events.append(_event(STOP, {}))
    return events
