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
import string
from itertools import accumulate, chain, pairwise

from gateway.protocols.openai_sse import DONE

FIELD = "obfuscation"
_MARK = b'"obfuscation"'
_ALPHABET = (string.ascii_letters + string.digits).encode()
# random bytes → letters and digits in one translate (the slight bias is no matter for padding)
_LETTERS = bytes(_ALPHABET[i % len(_ALPHABET)] for i in range(256))

# A padded stream as pieces of bytes, with fresh padding to go between each two: the text before
# each padded chunk's padding, the bound of its new length (twice the stored one's), the rest.
Template = tuple[list[bytes], list[int], bytes]


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
    heads: list[bytes] = []
    bounds: list[int] = []
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
        heads.append(head)
        bounds.append(max(2 * len(stored), 2))
        tail = bytearray(b'"}\n\n')
    return (heads, bounds, bytes(tail)) if heads else None


def filled(tpl: Template) -> bytes:
    """The stream with fresh padding: new characters, and a new length for each chunk (from 1 to
    twice the stored one, so the same overhead on average), as the upstream draws its own."""
    heads, bounds, tail = tpl
    # One read of the system's CSPRNG for the lengths and the letters: secrets.randbelow made a
    # getrandom call per chunk, and a padded hit cost 1.6x a plain one (docs/benchmarks.md). 16
    # bits modulo a bound of a few dozen is as good as uniform for padding.
    at = 2 * len(heads)
    raw = os.urandom(at + sum(bounds))
    draws = memoryview(raw)[:at].cast("H")
    ends = list(accumulate([1 + d % b for d, b in zip(draws, bounds, strict=True)], initial=at))
    letters = raw.translate(_LETTERS)
    pads = [letters[a:b] for a, b in pairwise(ends)]
    return b"".join(chain.from_iterable(zip(heads, pads, strict=True))) + tail
