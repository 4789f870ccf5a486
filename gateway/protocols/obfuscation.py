"""OpenAI's stream obfuscation on replays: the `obfuscation` padding a stored stream's chunks carry
is dropped for a client that asked for none (`stream_options.include_obfuscation: false`) and
drawn afresh, per replay, for every other client.

The padding hides each chunk's size from whoever watches the wire. Replayed as stored, every hit
of an entry had the same bytes, so anyone who asked the question once knew the exact sizes of
everyone else's answer to it. It never invents padding on a stream recorded without any (an
upstream that does not pad, or a leader that opted out): a hit sends what its miss would have.
"""

from __future__ import annotations

import json
import os
import secrets
import string

from gateway.protocols.openai_sse import DONE

FIELD = "obfuscation"
_MARK = b'"obfuscation"'
_ALPHABET = (string.ascii_letters + string.digits).encode()
# random bytes → letters and digits in one translate (the slight bias is no matter for padding)
_LETTERS = bytes(_ALPHABET[i % len(_ALPHABET)] for i in range(256))

# A padded stream as pieces of bytes, with fresh padding to go between each two: (text before
# the padding, the stored padding's length) per padded chunk, then the rest.
Template = tuple[list[tuple[bytes, int]], bytes]


def _parsed(event: bytes) -> dict[str, object] | None:
    """The chunk's JSON object when the event is a single `data:` line holding one with the
    field at its top level, else None (left as it is)."""
    if _MARK not in event or not event.startswith(b"data:") or b"\n" in event.strip():
        return None
    data = event[5:].strip()
    if data == DONE[5:].strip():
        return None
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get(FIELD), str):
        return None
    return doc


def stripped(events: list[bytes]) -> list[bytes]:
    """The stream for a client that asked for no padding."""
    out = []
    for e in events:
        doc = _parsed(e)
        if doc is not None:
            del doc[FIELD]
            e = b"data: " + json.dumps(doc).encode()
        out.append(e)
    return out


def template(events: list[bytes]) -> Template | None:
    """The stream with each chunk's padding left open, or None when no chunk carries any."""
    pieces: list[tuple[bytes, int]] = []
    tail = bytearray()
    for e in events:
        doc = _parsed(e)
        if doc is None:
            tail += e + b"\n\n"
            continue
        stored = doc.pop(FIELD)
        assert isinstance(stored, str)
        rest = json.dumps(doc).encode()[:-1]  # (the field goes last, as its own key)
        head = bytes(tail) + b"data: " + rest + (b", " if doc else b"") + b'"obfuscation": "'
        pieces.append((head, len(stored)))
        tail = bytearray(b'"}\n\n')
    return (pieces, bytes(tail)) if pieces else None


def filled(tpl: Template) -> bytes:
    """The stream with fresh padding: new characters, and a new length for each chunk (from 1 to
    twice the stored one, so the same overhead on average), as the upstream draws its own."""
    pieces, tail = tpl
    sizes = [1 + secrets.randbelow(max(2 * n, 2)) for _, n in pieces]
    letters = os.urandom(sum(sizes)).translate(_LETTERS)
    out = bytearray()
    at = 0
    for (head, _), size in zip(pieces, sizes, strict=True):
        out += head
        out += letters[at : at + size]
        at += size
    out += tail
    return bytes(out)
