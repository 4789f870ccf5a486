"""Request documents for local engines: JSON or msgpack by Content-Type, read as the protocol
layer reads them for the cache key.

The exact cache keys a msgpack body and its JSON twin alike, and an integral float like its
integer (cache.keys.normalise). An engine stricter than the key would refuse a request on a miss
and serve it once its twin had been cached: the answer would depend on cache state. So local
engines take what the key treats as the same request.
"""

from __future__ import annotations

import json
from typing import Any

import msgpack
import orjson

from backends.errors import BadInput

MSGPACK_TYPES = frozenset(
    {"application/msgpack", "application/x-msgpack", "application/vnd.msgpack"}
)

# Every digit as "0", so that bytes.find spots a run of them (re took 0.2 s over 16 MB)
_ZEROS = bytes.maketrans(b"123456789", b"000000000")
_RUN = b"0" * 19


def is_msgpack(content_type: str | None) -> bool:
    return (content_type or "").split(";", 1)[0].strip().lower() in MSGPACK_TYPES


def _plain(value: Any) -> Any:
    if isinstance(value, (msgpack.Timestamp, msgpack.ExtType)):
        # no JSON twin: the key could not canonicalise it (a Timestamp was a 500) and no
        # engine or upstream field takes one
        raise ValueError("msgpack extension types (timestamps included) are not accepted")
    return value


def _plain_map(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    out = {_plain(k): _plain(v) for k, v in pairs}
    # A key twice (or 1 and 1.0 and true, one key to a dict; or 1 and "1", one to the cache
    # key, which spells every key as a string) would leave the key one value of two, while
    # the upstream gets both and may read the other: refused, as JSON's duplicates are.
    if len(out) != len(pairs) or len({str(k) for k in out}) != len(out):
        raise ValueError("a map has the same key twice")
    return out


def _plain_list(items: list[Any]) -> list[Any]:
    return [_plain(v) for v in items]


def unpack_msgpack(body: bytes) -> Any:
    """A msgpack body as the key and the engines read it: str keys as str, other map keys
    allowed, no extension types anywhere (ValueError and msgpack's own errors otherwise)."""
    return _plain(
        msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=False,
            object_pairs_hook=_plain_map,
            list_hook=_plain_list,
        )
    )


def load_document(content_type: str | None, body: bytes, what: str) -> Any:
    """msgpack when the Content-Type says so, JSON otherwise; BadInput names `what` was wrong."""
    if is_msgpack(content_type):
        try:
            return unpack_msgpack(body)  # as the protocol layer reads it for the key
        except Exception as exc:  # msgpack raises several unrelated types
            raise BadInput(f"{what} is not valid msgpack: {exc}") from None
    try:
        return _json(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BadInput(f"{what} is not valid JSON: {exc}") from None


def _json(body: bytes) -> Any:
    """json.loads of the body's UTF-8 (as the key reads it: json.loads would also take UTF-16/32
    and a BOM), read by orjson where it gives the same: ~4x faster (16 MB of numbers: 0.4 s,
    all of it holding the GIL). orjson refuses NaN, Infinity and lone surrogates, which
    json.loads takes, and reads an integer past 64 bits as a float: json.loads reads those
    bodies (any run of 19 digits, anything orjson refuses), as it did all of them before."""
    if not _long_integer(body):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    return json.loads(body.decode("utf-8"))


def _long_integer(body: bytes) -> bool:
    """Whether a run of 19 or more digits that is no fraction's (not after a ".") is in the
    body: an integer orjson may read as a float. (Such runs in strings or exponents only send
    the body to json.loads.)"""
    zeros = body.translate(_ZEROS)
    i = zeros.find(_RUN)
    while i != -1:
        start = i
        while start and zeros[start - 1] == 0x30:  # "0"
            start -= 1
        if not start or zeros[start - 1] != 0x2E:  # "."
            return True
        end = i + len(_RUN)
        while end < len(zeros) and zeros[end] == 0x30:
            end += 1
        i = zeros.find(_RUN, end)
    return False


def as_integer(value: Any) -> int | None:
    """An integer field's value: an int, or a float with no fraction (384.0, as the key reads
    it); None for anything else (a bool is no integer here)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None
