"""A stored v2 JSON reply given another request's id, by splicing its top-level members.

A hit runs this on the event loop, so it must not parse the tensors: the top level is read
member by member and nested values are skipped as balanced brackets (bytes.find, not a parse).
Anything it does not recognise goes to the full parse, which gives the same keys and values;
what it does not check is the inside of nested values (as stored, whatever they hold)."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

_WS = re.compile(rb"[ \t\n\r]*")
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
# strings and what separates them, up to the next bracket or a quote that opens none
_STRINGS = re.compile(rb'(?:"[^"\\]*+(?:\\.[^"\\]*+)*+"[^"\[\]{}]*+)*+', re.DOTALL)
_QUOTE = ord('"')
_BRACKETS = tuple(b"[]{}")
_SPECIAL = (_QUOTE, *_BRACKETS)
_SCALAR = re.compile(rb"[^ \t\n\r,\]}]+")
_OPEN_ARRAY, _CLOSE_ARRAY, _OPEN_OBJECT, _CLOSE_OBJECT = b"[]{}"
_CLOSER = {_OPEN_OBJECT: _CLOSE_OBJECT, _OPEN_ARRAY: _CLOSE_ARRAY}
_STEPS = 256  # brackets read one by one before the rest of the value is read in numpy


class _Unread(Exception):
    """The fast reading gave up: the full parse decides."""


def with_id(head: bytes, request_id: Any) -> bytes | None:
    """The JSON header with `request_id` as its top-level id (first, as the full parse writes
    it), or without any id when it is None. None when the header already says exactly that, or
    is not a JSON object (served as stored)."""
    try:
        return _spliced(head, request_id)
    except (_Unread, ValueError):  # (ValueError: a top-level key or value json.loads refuses)
        return _reparsed(head, request_id)


def _reparsed(head: bytes, request_id: Any) -> bytes | None:
    try:
        doc = json.loads(head)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("id") == request_id:
        return None
    if request_id is None:
        doc.pop("id", None)
    else:
        doc = {"id": request_id, **{k: v for k, v in doc.items() if k != "id"}}
    return json.dumps(doc, separators=(",", ":")).encode()


def _spliced(head: bytes, request_id: Any) -> bytes | None:
    members, ids = _members(head)
    # a repeated key's last value is the one a parser keeps, as json.loads does
    stored = json.loads(head[ids[-1][1] : ids[-1][2]]) if ids else None
    if stored == request_id:
        return None
    view = memoryview(head)  # (the members are joined into the one copy made)
    parts: list[bytes | memoryview] = [b"{"]
    if request_id is not None:
        parts += [b'"id":', json.dumps(request_id).encode(), b","]
    for start, _, end, is_id in members:
        if not is_id:
            parts += [view[start:end], b","]
    if len(parts) > 1:
        parts[-1] = b"}"  # (in place of the last comma)
    else:
        parts.append(b"}")  # (the id was the only member)
    return b"".join(parts)


def _members(
    head: bytes,
) -> tuple[list[tuple[int, int, int, bool]], list[tuple[int, int, int, bool]]]:
    """Each top-level member as (start, value start, end, is the id), and the ids among them."""
    pos = _skip_ws(head, 0)
    if head[pos : pos + 1] != b"{":
        raise _Unread
    pos = _skip_ws(head, pos + 1)
    members: list[tuple[int, int, int, bool]] = []
    if head[pos : pos + 1] == b"}":
        return _closed(head, pos, members)
    while True:
        m = _STRING.match(head, pos)
        if m is None:
            raise _Unread
        key = m.group()
        is_id = key == b'"id"' or (b"\\" in key and json.loads(key) == "id")
        pos = _skip_ws(head, m.end())
        if head[pos : pos + 1] != b":":
            raise _Unread
        value = _skip_ws(head, pos + 1)
        end = _value_end(head, value)
        members.append((m.start(), value, end, is_id))
        pos = _skip_ws(head, end)
        sep = head[pos : pos + 1]
        if sep == b"}":
            return _closed(head, pos, members)
        if sep != b",":
            raise _Unread
        pos = _skip_ws(head, pos + 1)


def _closed(
    head: bytes, pos: int, members: list[tuple[int, int, int, bool]]
) -> tuple[list[tuple[int, int, int, bool]], list[tuple[int, int, int, bool]]]:
    if _skip_ws(head, pos + 1) != len(head):
        raise _Unread  # extra data after the object
    return members, [m for m in members if m[3]]


def _skip_ws(head: bytes, pos: int) -> int:
    m = _WS.match(head, pos)
    assert m is not None  # (matches the empty string)
    return m.end()


def _value_end(head: bytes, pos: int) -> int:
    first = head[pos : pos + 1]
    if first in (b"{", b"["):
        return _container_end(head, pos)
    m = (_STRING if first == b'"' else _SCALAR).match(head, pos)
    if m is None:
        raise _Unread
    json.loads(m.group())  # a top-level string or scalar is short: read it as the parse would
    return m.end()


def _container_end(head: bytes, pos: int) -> int:
    """Where the array or object opening at pos ends, stepping from bracket to bracket: the
    next of each kind is found by bytes.find (memchr), so a run of numbers or strings costs no
    Python step. Without a backslash, quotes alternate opening and closing, and their count's
    parity says whether a bracket is inside a string; with one, each string is matched."""
    try:
        try:
            return _brackets_end(head, pos)
        except _Nested:
            return _depth_end(head, pos)
    except _Escaped:
        return _strings_end(head, pos)


class _Escaped(Exception):
    """A backslash: a quote may not open or close a string."""


class _Nested(Exception):
    """Brackets by the thousand (data as nested lists): one Python step each is too many."""


def _brackets_end(head: bytes, pos: int) -> int:
    closers = [_CLOSER[head[pos]]]
    pos += 1
    size = len(head)
    inside = 0
    ahead = {c: _find(head, c, pos) for c in _BRACKETS}
    for _ in range(_STEPS):
        if not closers:
            return pos
        c, at = min(ahead.items(), key=_place)
        if at >= size:
            raise _Unread  # not closed
        if head.find(b"\\", pos, at) >= 0:
            raise _Escaped
        inside ^= head.count(b'"', pos, at) & 1
        if not inside:
            _step(closers, c)
        pos = at + 1
        ahead[c] = _find(head, c, pos)  # (the other kinds are further on)
    if closers:
        raise _Nested
    return pos


def _depth_end(head: bytes, pos: int) -> int:
    """_brackets_end's reading in numpy: the depth outside strings, where it first reaches 0
    (bracket kinds are not matched here: a nested value's inside is not checked)."""
    a = np.frombuffer(head, np.uint8)[pos:]
    inside = (np.cumsum(a == _QUOTE, dtype=np.int64) & 1).astype(bool)
    opens = ((a == _OPEN_ARRAY) | (a == _OPEN_OBJECT)) & ~inside
    closes = ((a == _CLOSE_ARRAY) | (a == _CLOSE_OBJECT)) & ~inside
    depth = np.cumsum(opens, dtype=np.int64) - np.cumsum(closes, dtype=np.int64)
    zero = np.flatnonzero(depth == 0)
    if not zero.size:
        raise _Unread  # not closed
    end = pos + int(zero[0]) + 1
    if head.find(b"\\", pos, end) >= 0:
        raise _Escaped
    return end


def _strings_end(head: bytes, pos: int) -> int:
    closers = [_CLOSER[head[pos]]]
    pos += 1
    size = len(head)
    ahead = {c: _find(head, c, pos) for c in _SPECIAL}
    while closers:
        c, at = min(ahead.items(), key=_place)
        if at >= size:
            raise _Unread  # not closed
        if c == _QUOTE:
            m = _STRINGS.match(head, at)
            assert m is not None  # (matches the empty string)
            if m.end() == at:
                raise _Unread  # a string left open
            pos = m.end()
        else:
            _step(closers, c)
            pos = at + 1
        for k, v in ahead.items():
            if v < pos:
                ahead[k] = _find(head, k, pos)
    return pos


def _step(closers: list[int], c: int) -> None:
    if c in _CLOSER:
        closers.append(_CLOSER[c])
    elif c == closers[-1]:
        closers.pop()
    else:
        raise _Unread  # a mismatched bracket


def _find(head: bytes, c: int, pos: int) -> int:
    at = head.find(c, pos)
    return len(head) if at < 0 else at


def _place(item: tuple[int, int]) -> int:
    return item[1]
