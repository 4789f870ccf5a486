"""Adapter contract: parse a request body into a typed Call. No I/O, no HTTP objects."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack

# one set with the local engines' (backends.bodies): a body the key reads as msgpack, they do too
from backends import MSGPACK_TYPES, unpack_msgpack
from gateway.errors import BadRequest

# Request headers an adapter puts into its key (anthropic: the API version and beta set).
# Anything keyed on request bytes without parsing them (the exact cache's alias) must tell
# these apart too.
KEYED_HEADERS = ("anthropic-version", "anthropic-beta")


@dataclass(slots=True)
class Call:
    """What a request asks for, in the terms caches and dispatch need.

    key_fields: every field that changes the answer, JSON-like (canonicalised by cache.keys).
    semantic_text: the text a semantic lookup embeds, or None when the call has none.
    context: what else defines the conversation for a semantic namespace (earlier turns,
        system prompt, tools, sampling parameters). Everything not in semantic_text.
    greedy: decoded at temperature 0, so its answer follows from the question's meaning; a
        seeded sampled call is deterministic (its request fixes its answer) but not greedy:
        reworded, it samples another path, and only a greedy answer can label by exact match.
    """

    protocol: str
    model: str | None
    key_fields: Any
    stream: bool = False
    deterministic: bool = False
    greedy: bool = False
    semantic_text: str | None = None
    context: Any = None
    kind: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class Adapter(Protocol):
    name: str
    # request headers (lower case) its keys hold: an answer may Vary on them and be stored
    keyed_headers: tuple[str, ...]

    def parse(
        self,
        method: str,
        path: str,
        query: str,
        content_type: str,
        body: bytes,
        headers: Mapping[str, str] | None = None,
    ) -> Call | None:
        """Return the Call, None when this path is not a parsed endpoint, or raise BadRequest."""
        ...


class JSONRefused(ValueError):
    """JSON that json.loads would take but the gateway refuses; its message is the 400's."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object with a key twice is refused: json.loads keeps the last value, and the cache
    key would be built from it, while the upstream gets the bytes as sent and may keep the
    first (rapidjson's FindMember, simdjson and others do). Its answer, stored under the key
    of the last value, would then be served to clients who sent only that one."""
    doc = dict(pairs)
    if len(doc) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise JSONRefused(f"has the key {k[:64]!r} twice in one object")
            seen.add(k)
    return doc


def _no_constant(name: str) -> Any:
    raise JSONRefused(f"holds {name}, which is not JSON (RFC 8259 has no NaN or Infinity)")


def loads(body: bytes | str, *, allow_nan: bool = False) -> Any:
    """json.loads, refusing duplicate keys; NaN/Infinity only when allow_nan (v2 tensor data
    may hold them as Python's json.dumps writes them; no OpenAI or Anthropic field takes one,
    and `Infinity` read as inf shared its key with `1e999`). Bytes must be UTF-8, without a
    byte order mark (RFC 8259 8.1): json.loads would take UTF-16 and UTF-32, a BOM, and a
    surrogate's own bytes (it decodes with surrogatepass), each keyed as its UTF-8 twin, which
    a replica that reads UTF-8 refuses (UnicodeDecodeError; JSONRefused for a BOM)."""
    text = body.decode("utf-8") if isinstance(body, bytes) else body
    if text.startswith("\ufeff"):  # (json.loads's own message suggests utf-8-sig)
        raise JSONRefused("starts with a byte order mark, which JSON on the wire must not")
    return json.loads(
        text, object_pairs_hook=_unique, parse_constant=None if allow_nan else _no_constant
    )


def decode_body(content_type: str, body: bytes, *, allow_nan: bool = False) -> Any:
    """JSON or msgpack → Python objects; BadRequest names what was wrong."""
    ctype = content_type.split(";", 1)[0].strip().lower()
    if ctype in MSGPACK_TYPES:
        try:
            return unpack_msgpack(body)
        except msgpack.StackError:  # (its message is empty)
            raise BadRequest("request body is nested too deeply") from None
        except Exception as exc:  # msgpack raises several unrelated types
            raise BadRequest(f"request body is not valid msgpack: {exc}") from None
    if not body:
        raise BadRequest("request body is empty; a JSON object is required")
    try:
        return loads(body, allow_nan=allow_nan)
    except UnicodeDecodeError:
        raise BadRequest("request body is not valid UTF-8 JSON") from None
    except JSONRefused as exc:
        raise BadRequest(f"request body {exc}") from None
    except json.JSONDecodeError as exc:
        raise BadRequest(
            f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise BadRequest("request body is nested too deeply") from None
    except ValueError as exc:  # e.g. an integer past Python's 4,300-digit conversion limit
        raise BadRequest(f"request body has a value out of range: {str(exc)[:120]}") from None


def odd_body_type(content_type: str) -> str | None:
    """The media type a JSON API's key holds beside the body it read: None for JSON (none sent,
    application/json, any +json) and msgpack, which the key reads alike; any other (text/plain,
    curl -d's form type) as sent, lower case. A JSON body labelled so is read by the key, but
    refused by a replica that reads bodies by their type (FastAPI, vLLM: a 422), so it must
    never be a hit on the entry of the JSON request."""
    ctype = content_type.split(";", 1)[0].strip().lower()
    if not ctype or ctype in MSGPACK_TYPES or ctype == "application/json":
        return None
    return None if ctype.endswith("+json") else ctype


def zero_temperature(doc: Mapping[str, Any]) -> bool:
    """temperature is the number 0: not false, not "0" (a lenient upstream may read those as
    0, but a call whose determinism rests on a coercion is treated as sampled: not replayed)."""
    t = doc.get("temperature", 1.0)
    return type(t) in (int, float) and t == 0


def require(cond: bool, message: str, param: str) -> None:
    """A 400 naming the offending field, in the route protocol's envelope."""
    if not cond:
        raise BadRequest(message, param=param)


def text_of(content: Any) -> str | None:
    """The plain text of a chat turn (a string, or a list of text blocks, as both OpenAI and
    Anthropic spell it); None when it holds anything but text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        parts = [b.get("text") for b in content if isinstance(b, dict) and b.get("type") == "text"]
        if len(parts) == len(content) and all(isinstance(p, str) for p in parts):
            return "\n".join(parts)  # type: ignore[arg-type]
    return None
