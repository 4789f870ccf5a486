"""OpenAI stream framing: SSE events ⇄ one JSON body, for chat and text completions.

A cached answer serves either framing: a stored stream becomes the `chat.completion` (or
`text_completion`) a non-streaming client expects, and a stored body becomes the chunks a
streaming client expects, ending in `data: [DONE]`.
"""

from __future__ import annotations

import json
from typing import Any

DONE = b"data: [DONE]"


def split_events(raw: bytes) -> list[bytes]:
    """SSE bytes → events (without their blank-line separators)."""
    return [e for e in raw.replace(b"\r\n", b"\n").split(b"\n\n") if e.strip()]


def join_events(events: list[bytes]) -> bytes:
    return b"".join(e + b"\n\n" for e in events)


def ends_done(events: list[bytes]) -> bool:
    """An event stream that ends in [DONE] (`data: [DONE]` or `data:[DONE]`): the whole rule
    for streams the gateway does not parse (a passthrough route's SSE)."""
    if not events:
        return False
    last = events[-1].strip().rsplit(b"\n", 1)[-1]
    return last.startswith(b"data:") and last[5:].strip() == b"[DONE]"


def completed(events: list[bytes]) -> bool:
    """A whole chat or completions answer: it ends in [DONE], no event carries an error (vLLM
    and SGLang report a failure mid-generation as `data: {"error": {...}}` and still send
    [DONE]; an `"error": null` beside the chunk's fields is none), and every choice it began has
    its finish_reason. A chunk not in the API's shape is not a whole answer either."""
    if not ends_done(events):
        return False
    try:
        docs = _payloads(events)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    finished: dict[int, bool] = {}
    for d in docs:
        if d.get("error") is not None:
            return False
        choices = d.get("choices") or []
        if not isinstance(choices, list):
            return False
        for ch in choices:
            i = ch.get("index", 0) if isinstance(ch, dict) else None
            if not isinstance(i, int) or isinstance(i, bool):
                return False
            finished[i] = finished.get(i, False) or ch.get("finish_reason") is not None
    return bool(finished) and all(finished.values())  # (no choice at all: no answer)


def _usage_chunk(event: bytes) -> bool:
    """The chunk `stream_options.include_usage` adds: no choices, the usage of the whole call."""
    if b'"usage"' not in event:
        return False
    try:
        docs = _payloads([event])
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    return any(d.get("choices") == [] and d.get("usage") is not None for d in docs)


def has_usage(events: list[bytes]) -> bool:
    return any(_usage_chunk(e) for e in events)


def without_usage(events: list[bytes]) -> list[bytes]:
    """The stream as a client that did not ask for usage gets it: the SDK's usual
    `chunk.choices[0]` loop fails on the usage chunk."""
    return [e for e in events if not _usage_chunk(e)]


def body_has_usage(body: bytes) -> bool:
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(doc, dict) and doc.get("usage") is not None


def _payloads(events: list[bytes]) -> list[dict[str, Any]]:
    out = []
    for e in events:
        for line in e.split(b"\n"):
            if line.startswith(b"data:"):
                data = line[5:].strip()
                if data and data != b"[DONE]":
                    doc = json.loads(data)
                    if isinstance(doc, dict):
                        out.append(doc)
    return out


def _merge_tool_calls(acc: list[dict[str, Any]], deltas: list[dict[str, Any]]) -> None:
    """Each delta onto the call at its index: the text of an object's fields joined in order
    (a function's name and arguments, a custom tool's name and input: a call's type says
    which object it has, so none is assumed), its id and type as said."""
    for d in deltas:
        i = d.get("index", 0)
        while len(acc) <= i:
            acc.append({"id": None})
        tc = acc[i]
        for k, v in d.items():
            if k == "index":
                continue
            if isinstance(v, dict):
                part = tc.setdefault(k, {})
                for name, piece in v.items():
                    if isinstance(piece, str):
                        part[name] = (part.get(name) or "") + piece
                    elif piece is not None:
                        part[name] = piece
            elif v:  # (a later chunk's null or "" id or type repeats nothing)
                tc[k] = v


def _whole_tool_calls(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The assembled calls as the API's body has them: a call that did not say its type is a
    function's (as the API's deltas after the first), and a function call has a name and
    arguments even when its stream sent none."""
    for tc in tools:
        objects = [k for k, v in tc.items() if isinstance(v, dict)]
        tc["type"] = tc.get("type") or (objects[0] if objects else "function")
        if tc["type"] == "function":
            fn = tc.setdefault("function", {})
            fn.setdefault("name", "")
            fn.setdefault("arguments", "")
    return tools


# What the whole answer says beside its choices, repeated on every chunk of its stream
# (`service_tier`: the tier that served it, "flex", "priority" or "default", where the request
# may have said "auto").
_ANSWER_FIELDS = ("system_fingerprint", "service_tier")
# What the answer says about its prompt, once, on its stream's first chunk: Azure's prompt
# filter results, vLLM's `prompt_token_ids` (return_token_ids) and `prompt_text`.
_PROMPT_FIELDS = ("prompt_filter_results", "prompt_token_ids", "prompt_text")


# A chunk's choice fields the conversion reads itself; any other is the server's own.
_CHOICE_FIELDS = frozenset({"index", "delta", "text", "logprobs", "finish_reason"})


class _Unconvertible(Exception):
    """A stored answer in a shape the conversion cannot carry over whole."""


def events_to_body(events: list[bytes], kind: str) -> bytes | None:
    """The single JSON body equivalent to a finished stream, or None when it cannot be built
    (a chunk out of the API's shape: the entry then answers only streaming clients)."""
    try:
        return _events_to_body(events, kind)
    except (_Unconvertible, TypeError, AttributeError, KeyError, ValueError):
        return None


def body_to_events(body: bytes, kind: str, include_usage: bool = False) -> list[bytes] | None:
    """The stream equivalent to a stored JSON answer (ending in [DONE]), or None (a body out
    of the API's shape: the entry then answers only JSON clients)."""
    try:
        return _body_to_events(body, kind, include_usage)
    except (TypeError, AttributeError, KeyError, ValueError):
        return None


def _events_to_body(events: list[bytes], kind: str) -> bytes | None:
    try:
        chunks = _payloads(events)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not chunks:
        return None
    # the answer's id, created and model: Azure OpenAI opens its stream with a chunk of no
    # choices for its prompt filter, whose id and model are "" and created 0
    first = next((c for c in chunks if c.get("choices")), chunks[0])
    choices: dict[int, dict[str, Any]] = {}
    usage = None
    for chunk in chunks:
        usage = chunk.get("usage") or usage
        for ch in chunk.get("choices") or []:
            i = ch.get("index", 0)
            if kind == "chat":
                c = choices.setdefault(
                    i,
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": None},
                        "logprobs": None,
                        "finish_reason": None,
                        "_tools": [],
                    },
                )
                delta = ch.get("delta") or {}
                c["logprobs"] = _merge_logprobs(c["logprobs"], ch.get("logprobs"))
                _merge_delta(c["message"], c["_tools"], delta)
            else:
                c = choices.setdefault(
                    i, {"index": i, "text": "", "logprobs": None, "finish_reason": None}
                )
                c["text"] += ch.get("text") or ""
                c["logprobs"] = _merge_logprobs(c["logprobs"], ch.get("logprobs"))
            if ch.get("finish_reason") is not None:
                c["finish_reason"] = ch["finish_reason"]
            for k, v in ch.items():  # a server's own per-choice fields (vLLM's stop_reason,
                # Azure's content_filter_results): as the last chunk that says one (a null or
                # empty one only when none did); a list is the chunk's own part of it (vLLM's
                # token_ids), joined in order
                if k in _CHOICE_FIELDS or k == "message":
                    continue
                prev = c.get(k)
                if isinstance(v, list) and isinstance(prev, list):
                    c[k] = [*prev, *v]
                elif v not in (None, {}, []) or k not in c:
                    c[k] = v
    for c in choices.values():
        tools = c.pop("_tools", None)
        if tools:
            c["message"]["tool_calls"] = _whole_tool_calls(tools)
        calls = tools or c.get("message", {}).get("function_call")
        if calls and c["message"]["content"] == "":  # only the opening "" delta: null, as a
            c["message"]["content"] = None  # tool or function call's message has
        if "refusal" in c.get("message", {}):
            # OpenAI's own stream (and Azure's) names `refusal` on its first delta; its body's
            # message always has `annotations`, [] when there are none: a client that reads
            # them (`for a in message.annotations`) failed on None. Other servers (vLLM's
            # annotations are null) leave it out of their streams and get none.
            c["message"].setdefault("annotations", [])
    out: dict[str, Any] = {
        "id": first.get("id"),
        "object": "chat.completion" if kind == "chat" else "text_completion",
        "created": first.get("created"),
        "model": first.get("model"),
        "choices": [choices[i] for i in sorted(choices)],
    }
    for name in (*_ANSWER_FIELDS, *_PROMPT_FIELDS):  # the first chunk that says it
        value = next((c[name] for c in chunks if c.get(name) is not None), None)
        if value is not None:
            out[name] = value
    if usage is not None:
        out["usage"] = usage
    return json.dumps(out).encode()


def _merge_delta(msg: dict[str, Any], tools: list[dict[str, Any]], delta: dict[str, Any]) -> None:
    """One chunk's delta into the message: every text field is appended in order (content,
    refusal, and what servers add beside them: vLLM's and DeepSeek's reasoning_content, ...),
    tool_calls and the legacy function_call are assembled from their pieces."""
    for k, v in delta.items():
        if k == "role":
            if v:
                msg["role"] = v
        elif k == "tool_calls":
            if v:
                _merge_tool_calls(tools, v)
        elif k == "function_call":
            if isinstance(v, dict):
                fc = msg.setdefault("function_call", {"name": "", "arguments": ""})
                fc["name"] += v.get("name") or ""
                fc["arguments"] += v.get("arguments") or ""
        elif v is None:  # a field the stream names as null (OpenAI's `refusal`): its body's
            msg.setdefault(k, None)  # message has it too, null unless another chunk says more
        elif isinstance(v, str):
            msg[k] = (msg.get(k) or "") + v
        elif isinstance(v, list):  # annotations (url citations): each chunk adds its own
            msg[k] = [*(msg.get(k) or []), *v]
        elif isinstance(v, dict):
            # an object sent whole in one chunk is kept; one in pieces (streamed audio: base64
            # that does not join as text) is not converted at all
            if msg.get(k) is not None:
                raise _Unconvertible(k)
            msg[k] = v


def _merge_logprobs(acc: dict[str, Any] | None, new: Any) -> dict[str, Any] | None:
    """Stream chunks carry the logprobs of their own tokens: the whole answer's are the lists
    joined in order (chat: content, refusal; completions: tokens, token_logprobs,
    top_logprobs, text_offset)."""
    if not isinstance(new, dict):
        return acc
    out = dict(acc or {})
    for k, v in new.items():
        if isinstance(v, list):
            out[k] = [*(out.get(k) or []), *v]
        else:
            out.setdefault(k, v)
    return out


def _own_fields(choice: dict[str, Any]) -> dict[str, Any]:
    """A stored choice's fields beside the API's (vLLM's stop_reason, Azure's
    content_filter_results): the stream says them on the choice's last chunk."""
    return {k: v for k, v in choice.items() if k not in _CHOICE_FIELDS and k != "message"}


def _event(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc).encode()


def _body_to_events(body: bytes, kind: str, include_usage: bool) -> list[bytes] | None:
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("choices"), list):
        return None
    base: dict[str, Any] = {
        "id": doc.get("id"),
        "created": doc.get("created"),
        "model": doc.get("model"),
    }
    base["object"] = "chat.completion.chunk" if kind == "chat" else "text_completion"
    for name in _ANSWER_FIELDS:
        if doc.get(name) is not None:
            base[name] = doc[name]
    prompt = {name: doc[name] for name in _PROMPT_FIELDS if doc.get(name) is not None}
    events: list[bytes] = []
    for ch in doc["choices"]:
        i = ch.get("index", 0)
        head = base if events else {**base, **prompt}  # (the stream's first chunk)
        if kind == "chat":
            msg = ch.get("message") or {}
            # the API opens a text answer with content "" and a tool call's or a refusal's
            # with null: the SDK's accumulated message then has the stored one's content
            opening = "" if isinstance(msg.get("content"), str) else None
            first: dict[str, Any] = {"role": msg.get("role", "assistant"), "content": opening}
            events.append(
                _event(
                    {
                        **head,
                        "choices": [
                            {"index": i, "delta": first, "logprobs": None, "finish_reason": None}
                        ],
                    }
                )
            )
            delta: dict[str, Any] = {}
            for k, v in msg.items():  # every field with something in it: text (content,
                # refusal, reasoning_content), annotations, audio, function_call
                if k not in ("role", "tool_calls") and v not in (None, "", [], {}):
                    delta[k] = v
            if msg.get("tool_calls"):
                delta["tool_calls"] = [{"index": n, **tc} for n, tc in enumerate(msg["tool_calls"])]
            # the answer's logprobs ride on the chunk with its tokens (the last one without)
            logprobs = ch.get("logprobs")
            if delta:
                events.append(
                    _event(
                        {
                            **base,
                            "choices": [
                                {
                                    "index": i,
                                    "delta": delta,
                                    "logprobs": logprobs,
                                    "finish_reason": None,
                                }
                            ],
                        }
                    )
                )
            events.append(
                _event(
                    {
                        **base,
                        "choices": [
                            {
                                "index": i,
                                "delta": {},
                                "logprobs": None if delta else logprobs,
                                "finish_reason": ch.get("finish_reason"),
                                **_own_fields(ch),
                            }
                        ],
                    }
                )
            )
        else:
            events.append(
                _event(
                    {
                        **head,
                        "choices": [
                            {
                                "index": i,
                                "text": ch.get("text", ""),
                                "logprobs": ch.get("logprobs"),
                                "finish_reason": ch.get("finish_reason"),
                                **_own_fields(ch),
                            }
                        ],
                    }
                )
            )
    if include_usage and doc.get("usage") is not None:
        events.append(_event({**base, "choices": [], "usage": doc["usage"]}))
    events.append(DONE)
    return events
