"""What an answer says, as text a label can compare: generated text and tool calls.

Labels for the error budget compare the answer a semantic hit would serve with a fresh upstream
answer. Only what the model produced counts (ids, timestamps and usage differ between two calls
that mean the same), and all of it: an answer that is a tool call is its function's name and
arguments, so two calls to one tool with other arguments disagree rather than both reading as
"". Shapes: OpenAI chat and completions (a JSON body or SSE chunks, `tool_calls` and the legacy
`function_call`), and Anthropic Messages (content blocks, or their SSE deltas; `thinking`
blocks are reasoning, not the answer, and are left out).
"""

from __future__ import annotations

import json
from typing import Any

from cache.codec import CacheEntry


def answer_text(entry: CacheEntry) -> str | None:
    """The answer of a successful chat/completions/messages entry (JSON body or SSE events);
    None when the entry is not a successful answer of one of those shapes (no label)."""
    if not 200 <= entry.status < 300:
        return None
    if entry.events is not None:
        return _events_text(entry.events)
    if entry.body is None:
        return None
    try:
        doc = json.loads(entry.body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict):
        return None
    if isinstance(doc.get("choices"), list) and doc["choices"]:
        parts = _Parts()
        parts.openai_choice(doc["choices"][0], delta=False)
        return parts.render()
    if doc.get("type") == "message" and isinstance(doc.get("content"), list):
        parts = _Parts()
        for block in doc["content"]:
            parts.anthropic_block(block)
        return parts.render()
    return None


def reply_text(doc: Any) -> str:
    """The generated text of a chat completion's first choice ("" for another shape)."""
    choices = doc.get("choices") if isinstance(doc, dict) else None
    if not isinstance(choices, list) or not choices:
        return ""
    parts = _Parts()
    parts.openai_choice(choices[0], delta=False)
    return "".join(parts.text)


def _canonical(arguments: Any) -> str:
    """Tool arguments as one string whatever their key order or spacing (a string that is not
    JSON stays as it came: a model may stream arguments that do not parse)."""
    value = arguments
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except json.JSONDecodeError:
            return arguments.strip()
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


class _Parts:
    """An answer assembled from a whole message or from its stream of deltas."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.refusal: list[str] = []  # a refusal is an answer too, and not any other one
        self.tools: dict[int, list[str]] = {}  # position -> [name, arguments]

    def tool(self, index: int, name: Any = None, arguments: Any = None) -> None:
        slot = self.tools.setdefault(index, ["", ""])
        if isinstance(name, str):
            slot[0] += name
        if isinstance(arguments, str):
            slot[1] += arguments
        elif arguments is not None:
            slot[1] += json.dumps(arguments)

    def render(self) -> str:
        calls = [
            # no arguments reads as {} (a stream sends "" where its JSON form has input {})
            f"[tool call] {name}({_canonical(args or '{}')})"
            for _, (name, args) in sorted(self.tools.items())
        ]
        text = "".join(self.text)
        if self.refusal:
            calls.insert(0, "[refusal] " + "".join(self.refusal))
        return "\n".join([text, *calls] if text else calls) if calls else text

    def openai_choice(self, choice: Any, delta: bool) -> None:
        if not isinstance(choice, dict):
            return
        if isinstance(choice.get("text"), str):  # completions
            self.text.append(choice["text"])
            return
        msg = choice.get("delta" if delta else "message")
        if not isinstance(msg, dict):
            return
        content = msg.get("content")
        if isinstance(content, str):
            self.text.append(content)
        elif isinstance(content, list):  # content parts
            self.text.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
        audio = msg.get("audio")
        if isinstance(audio, dict) and isinstance(audio.get("transcript"), str):
            self.text.append(audio["transcript"])  # an audio answer says what its transcript says
        if isinstance(msg.get("refusal"), str):
            self.refusal.append(msg["refusal"])
        for pos, call in enumerate(msg.get("tool_calls") or []):
            if isinstance(call, dict) and isinstance(fn := call.get("function"), dict):
                index = call.get("index", pos) if delta else pos
                self.tool(
                    index if isinstance(index, int) else pos, fn.get("name"), fn.get("arguments")
                )
        legacy = msg.get("function_call")
        if isinstance(legacy, dict):  # the legacy single function call
            self.tool(-1, legacy.get("name"), legacy.get("arguments"))

    def anthropic_block(self, block: Any, index: int | None = None) -> None:
        if not isinstance(block, dict):
            return
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            self.text.append(block["text"])
        elif kind in ("tool_use", "server_tool_use"):
            # a streamed block starts with input {} and sends its input as JSON deltas
            given = block.get("input")
            pos = len(self.tools) if index is None else index
            self.tool(pos, block.get("name"), given if given or index is None else None)

    def anthropic_event(self, doc: dict[str, Any]) -> None:
        index = doc.get("index")
        if not isinstance(index, int):
            return
        if doc.get("type") == "content_block_start":
            self.anthropic_block(doc.get("content_block"), index)
        elif doc.get("type") == "content_block_delta" and isinstance(doc.get("delta"), dict):
            d = doc["delta"]
            if d.get("type") == "text_delta" and isinstance(d.get("text"), str):
                self.text.append(d["text"])
            elif d.get("type") == "input_json_delta" and index in self.tools:
                self.tool(index, arguments=d.get("partial_json"))


def _events_text(events: list[bytes]) -> str | None:
    parts = _Parts()
    for event in events:
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if not data or data == b"[DONE]":
                continue
            try:
                doc = json.loads(data)
            except (json.JSONDecodeError, UnicodeDecodeError):
                return None
            if not isinstance(doc, dict):
                continue
            if "choices" in doc:
                for choice in doc.get("choices") or []:
                    if isinstance(choice, dict) and choice.get("index", 0) == 0:
                        parts.openai_choice(choice, delta=True)
            else:
                parts.anthropic_event(doc)
    return parts.render()
