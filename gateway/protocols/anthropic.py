"""Anthropic Messages API adapter: POST /v1/messages → Call.

The key covers every body field that changes the answer (model, system, messages, tools,
tool_choice, stop_sequences, max_tokens, sampling parameters, ...) in a canonical form where a
string `content` or `system` equals the single text block it abbreviates, plus the
`anthropic-version` and `anthropic-beta` headers: a different API version or beta set may
answer differently, so it never shares an entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from multidict import CIMultiDict, CIMultiDictProxy

from gateway.headers import field
from gateway.protocols.base import (
    KEYED_HEADERS,
    Call,
    decode_body,
    odd_body_type,
    require,
    text_of,
    zero_temperature,
)

PATH = "/v1/messages"
KIND = "messages"
# Bookkeeping and framing only: `metadata.user_id` tags the caller, `stream` the framing.
IGNORED_FIELDS = frozenset({"stream", "metadata"})


def _blocks(content: Any) -> Any:
    """A string is shorthand for one text block: both spellings get one key."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content


def _check_blocks(content: Any, where: str) -> None:
    """Each block of a content array is an object with a string `type`, and a text block's
    `text` is a string: the Messages API's own 400s, said in its envelope before the round
    trip (an upstream that took them on trust failed with a 500 of its own). Other block
    types pass as sent: the API adds new ones, the upstream judges them, the key holds them."""
    if not isinstance(content, list):
        return
    for j, block in enumerate(content):
        require(
            isinstance(block, dict) and isinstance(block.get("type"), str),
            f"{where}[{j}] must be an object with a string 'type'",
            f"{where}[{j}]",
        )
        if block["type"] == "text":
            require(
                isinstance(block.get("text"), str),
                f"{where}[{j}].text must be a string (a text block's text)",
                f"{where}[{j}].text",
            )


def _plain_metadata(metadata: Any) -> bool:
    """`metadata` as the API takes it (an object with at most a string or null `user_id`),
    which tags the caller and changes no answer. Anything else the API refuses with a 400:
    keyed, so it is never answered from a well-formed request's entry."""
    if not isinstance(metadata, dict) or not set(metadata) <= {"user_id"}:
        return False
    user = metadata.get("user_id")
    return user is None or isinstance(user, str)


def _beta_set(value: str) -> list[str]:
    """`anthropic-beta` is a comma-separated set: order and repeats do not change it."""
    return sorted({v.strip() for v in value.split(",") if v.strip()})


def key_headers(headers: Mapping[str, str] | None) -> dict[str, Any]:
    if headers is None:
        return {}
    out: dict[str, Any] = {}
    version = _lines(headers, "anthropic-version")
    if version is not None:
        out["anthropic-version"] = version.strip()
    beta = _lines(headers, "anthropic-beta")
    if beta is not None:
        out["anthropic-beta"] = _beta_set(beta)
    return out


def _lines(headers: Mapping[str, str], name: str) -> str | None:
    """Every line of a header, combined (RFC 9110 5.3): the upstream gets them all, so the key
    must too (a second `anthropic-beta` line is another request)."""
    if isinstance(headers, CIMultiDict | CIMultiDictProxy):
        return field(headers, name)
    return headers.get(name)


class AnthropicAdapter:
    name = "anthropic"
    keyed_headers: tuple[str, ...] = KEYED_HEADERS

    def __init__(self, extra_ignored: frozenset[str] = frozenset()) -> None:
        self._ignored = IGNORED_FIELDS | extra_ignored

    def parse(
        self,
        method: str,
        path: str,
        query: str,
        content_type: str,
        body: bytes,
        headers: Mapping[str, str] | None = None,
    ) -> Call | None:
        # `path` is the raw path (the key holds it as sent); the endpoint is its decoded form
        if (unquote(path) if "%" in path else path).rstrip("/") != PATH or method != "POST":
            return None
        doc = decode_body(content_type, body)
        require(isinstance(doc, dict), "request body must be a JSON object", "body")
        model = doc.get("model")
        require(
            isinstance(model, str) and model != "",
            "'model' is required and must be a string",
            "model",
        )
        max_tokens = doc.get("max_tokens")
        require(
            isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0,
            "'max_tokens' is required and must be a positive integer",
            "max_tokens",
        )
        stream = doc.get("stream", False)
        require(isinstance(stream, bool), "'stream' must be a boolean", "stream")
        messages = doc.get("messages")
        require(
            isinstance(messages, list) and len(messages) > 0,
            "'messages' is required and must be a non-empty array",
            "messages",
        )
        assert isinstance(messages, list)
        for i, m in enumerate(messages):
            require(
                isinstance(m, dict)
                and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), (str, list)),
                f"messages[{i}] must be an object with a string 'role' and a 'content' "
                "string or array",
                f"messages[{i}]",
            )
            _check_blocks(m["content"], f"messages[{i}].content")
        system = doc.get("system")
        require(
            system is None or isinstance(system, (str, list)),
            "'system' must be a string or an array of text blocks",
            "system",
        )
        _check_blocks(system, "system")
        ignored = self._ignored
        if "metadata" in doc and not _plain_metadata(doc["metadata"]):
            ignored = ignored - {"metadata"}  # a request the API refuses: never a valid one's key
        fields = {k: v for k, v in doc.items() if k not in ignored}
        fields["messages"] = [{**m, "content": _blocks(m["content"])} for m in messages]
        if system is not None:
            fields["system"] = _blocks(system)
        hdrs = key_headers(headers)
        key: dict[str, Any] = {"body": fields, "headers": hdrs, "query": query}
        if path != PATH:  # `/v1/messages/`: another URI, never the entry of the path without
            key["path"] = path
        call = Call(
            "anthropic",
            model,
            # the query (the SDK's beta client sends ?beta=true) may change the answer too
            key,
            stream=stream,
            kind=KIND,
            deterministic=zero_temperature(doc),
            greedy=zero_temperature(doc),
        )
        last = messages[-1]
        # Only a final user turn is a question a semantic cache may answer; the namespace is
        # everything else (system, earlier turns, tools, parameters, version headers).
        if last.get("role") == "user":
            call.semantic_text = text_of(last.get("content"))
        context = {k: v for k, v in fields.items() if k != "messages"}
        context["messages"] = fields["messages"][:-1]
        context["last"] = {k: v for k, v in last.items() if k != "content"}
        call.context = {"body": context, "headers": hdrs, "query": query}
        if path != PATH:
            call.context["path"] = path
        if (odd := odd_body_type(content_type)) is not None:
            call.key_fields["type"] = odd
            if isinstance(call.context, dict):  # (embeddings have no namespace)
                call.context["type"] = odd
        return call
