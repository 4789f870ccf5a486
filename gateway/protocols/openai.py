"""OpenAI-compatible adapter: /v1/chat/completions, /v1/completions, /v1/embeddings → Call."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from gateway.errors import PayloadTooLarge
from gateway.protocols.base import (
    Call,
    decode_body,
    odd_body_type,
    require,
    text_of,
    zero_temperature,
)

# Fields that change only the framing or the bookkeeping, never the answer.
IGNORED_FIELDS = frozenset({"stream", "stream_options", "user"})
_KINDS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
}
# Azure OpenAI clients (openai.AzureOpenAI) name the deployment in the path.
_AZURE = re.compile(r"^/openai/deployments/[^/]+/(chat/completions|completions|embeddings)$")


def kind_of(path: str) -> str | None:
    path = path.rstrip("/")
    kind = _KINDS.get(path)
    if kind is None and (m := _AZURE.match(path)) is not None:
        kind = _KINDS["/v1/" + m.group(1)]
    return kind


class OpenAIAdapter:
    name = "openai"
    keyed_headers: tuple[str, ...] = ()

    def __init__(self, extra_ignored: frozenset[str] = frozenset(), max_items: int = 2048) -> None:
        self._ignored = IGNORED_FIELDS | extra_ignored
        # stream_options is framing only for a streamed call: on one that does not stream,
        # OpenAI and vLLM refuse it (400), so it is keyed (never the plain call's entry)
        self._plain_ignored = (IGNORED_FIELDS - {"stream_options"}) | extra_ignored
        self._max_items = max_items

    def parse(
        self,
        method: str,
        path: str,
        query: str,
        content_type: str,
        body: bytes,
        headers: Mapping[str, str] | None = None,
    ) -> Call | None:
        # `path` is the raw path, as the upstream gets it: the endpoint is read from its decoded
        # form (as the route matched it), the key and namespace hold it as sent
        kind = kind_of(unquote(path) if "%" in path else path)
        if kind is None or method != "POST":
            return None
        doc = decode_body(content_type, body)
        require(isinstance(doc, dict), "request body must be a JSON object", "body")
        model = doc.get("model")
        require(
            isinstance(model, str) and model != "",
            "'model' is required and must be a string",
            "model",
        )
        # nullable in the API (null: not streamed), and the SDK sends `stream=None` as null
        stream = doc.get("stream")
        stream = False if stream is None else stream
        require(isinstance(stream, bool), "'stream' must be a boolean or null", "stream")
        options = doc.get("stream_options")
        if framing_only(kind, stream, options):
            ignored = self._ignored
        elif stream:  # a stream of its own shape: `stream` is keyed too, so a plain call with
            ignored = self._plain_ignored - {"stream"}  # the same options never shares it
        else:
            ignored = self._plain_ignored
        if "user" in doc and not isinstance(doc["user"], str):
            ignored = ignored - {"user"}  # a request the API refuses: never a valid one's key
        fields = {k: v for k, v in doc.items() if k not in ignored}
        # The path names an Azure deployment and the query an api-version (or a key some
        # servers take there): answers from another deployment or version are another answer.
        # The path as sent: `/v1/chat/completions/` is another URI (RFC 9110 4.2.3), which an
        # upstream may refuse or redirect, so it never shares the entry of the path without.
        target = path + ("?" + query if query else "")
        call = Call("openai", model, {"body": fields, "target": target}, stream=stream, kind=kind)
        asked = options if isinstance(options, dict) else {}
        call.extra["include_usage"] = bool(asked.get("include_usage"))
        call.extra["continuous_usage"] = stream and bool(asked.get("continuous_usage_stats"))
        # OpenAI pads each chunk unless told not to (gateway/protocols/obfuscation.py)
        call.extra["obfuscation"] = asked.get("include_obfuscation") is not False
        if kind == "chat":
            self._chat(doc, fields, target, call)
        elif kind == "completions":
            require("prompt" in doc, "'prompt' is required", "prompt")
            prompt = doc["prompt"]
            quoted = quotes_prompt(doc)
            call.semantic_text = prompt if isinstance(prompt, str) and not quoted else None
            call.context = {
                "body": {k: v for k, v in fields.items() if k != "prompt"},
                "target": target,
            }
            call.deterministic, call.greedy = _deterministic(doc), zero_temperature(doc)
        else:
            require("input" in doc, "'input' is required", "input")
            items = doc["input"]
            if isinstance(items, list) and len(items) > self._max_items:
                raise PayloadTooLarge(
                    f"'input' has {len(items)} items; this route takes at most {self._max_items}",
                    param="input",
                )
            call.deterministic = call.greedy = True
            call.extra["input"] = doc["input"]
        if (odd := odd_body_type(content_type)) is not None:
            call.key_fields["type"] = odd
            if isinstance(call.context, dict):  # (embeddings have no namespace)
                call.context["type"] = odd
        return call

    def _chat(self, doc: dict[str, Any], fields: dict[str, Any], target: str, call: Call) -> None:
        messages = doc.get("messages")
        require(
            isinstance(messages, list) and len(messages) > 0,
            "'messages' is required and must be a non-empty array",
            "messages",
        )
        assert isinstance(messages, list)
        for i, m in enumerate(messages):
            require(
                isinstance(m, dict) and isinstance(m.get("role"), str),
                f"messages[{i}] must be an object with a string 'role'",
                f"messages[{i}]",
            )
        last = messages[-1]
        # Only a final user turn is a question a semantic cache may answer.
        if last.get("role") == "user" and not quotes_prompt(doc, chat=True):
            call.semantic_text = text_of(last.get("content"))
        context = {k: v for k, v in fields.items() if k != "messages"}
        context["messages"] = messages[:-1]
        # the last turn's other fields (its speaker's `name`, ...): only its text is the question
        context["last"] = {k: v for k, v in last.items() if k != "content"}
        call.context = {"body": context, "target": target}
        call.deterministic, call.greedy = _deterministic(doc), zero_temperature(doc)


def framing_only(kind: str, stream: bool, options: Any) -> bool:
    """Do `stream` and `stream_options` change only the framing of this call's answer (which
    the cache renders from a stored answer in either framing), so they stay out of its key?

    Only on a streamed chat or completions call, with options as the API takes them (booleans:
    other values it refuses) that do not ask for vLLM's `continuous_usage_stats`: usage on every
    chunk, which no other call's answer has (and a stored body cannot give), so such a call
    keys its options. An embeddings answer has no stream: OpenAI refuses `stream: true` there
    (an unrecognised argument) where vLLM ignores it, so it is keyed, never the plain call's.
    """
    if not stream or kind == "embeddings":
        return False
    if options is None:
        return True
    return (
        isinstance(options, dict)
        and all(v is None or type(v) is bool for v in options.values())
        and not options.get("continuous_usage_stats")
    )


def quotes_prompt(doc: dict[str, Any], chat: bool = False) -> bool:
    """The answer holds the prompt's own text or tokens, not only an answer to what it means:
    `echo` (completions; vLLM's chat too) writes the prompt before the completion, vLLM's
    `prompt_logprobs` and `return_token_ids` list the prompt's tokens, and its chat's
    `continue_final_message` or `add_generation_prompt: false` continue the last turn's text
    rather than answer it. A paraphrase's stored answer would quote the other question, so
    such a call has no semantic text (the exact cache still serves its repeats)."""
    if doc.get("echo") not in (None, False) or doc.get("prompt_logprobs") is not None:
        return True
    if doc.get("return_token_ids") not in (None, False):
        return True
    if chat and doc.get("continue_final_message") not in (None, False):
        return True
    return chat and doc.get("add_generation_prompt") is False


def _deterministic(doc: dict[str, Any]) -> bool:
    # an integer seed, as the API defines it: a string or a boolean determines nothing
    return zero_temperature(doc) or type(doc.get("seed")) is int
