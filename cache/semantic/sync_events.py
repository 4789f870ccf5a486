"""The semantic sync stream's events as the tail reads them (cache.semantic.sync): each one it
can apply, or why it cannot. Reading only: applying them is the sync's.

An event the tail cannot apply (written by hand with XADD, or by another version) is skipped,
counted and logged once, and the tail reads on. Before, an add whose origin was not UTF-8 failed
its whole batch before the tail's position moved: the tail read the same batch again, for ever,
and every process sharing the index stopped receiving adds, removals and bars.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from cache.stream_fields import Unusable, text

Op = Literal["add", "del", "bar"]
_OPS: dict[bytes, Op] = {b"add": "add", b"del": "del", b"bar": "bar"}


@dataclass(frozen=True, slots=True)
class Event:
    op: Op
    origin: str
    key: str | None  # None: an add carrying its record (the version before events named it)
    record: bytes | None = None  # that record
    bar: float = 0.0  # a bar event's new bar

    @property
    def names_record(self) -> bool:
        """An add whose record the tail reads from the hash."""
        return self.op == "add" and self.record is None


def parse(fields: dict[bytes, bytes]) -> Event:
    """The event in a stream entry's fields; Unusable for one the tail cannot apply."""
    op = _OPS.get(fields.get(b"op", b""))
    if op is None:
        raise Unusable(f"an unknown op {fields.get(b'op')!r}")
    origin, key = text(fields, b"o") or "", text(fields, b"k")
    if op == "add":
        record = fields.get(b"e")
        if key is None and record is None:
            raise Unusable("an add naming no record")
        return Event(op, origin, key, record)
    if key is None:
        raise Unusable(f"a {op} naming no key")
    if op == "del":
        return Event(op, origin, key)
    try:
        bar = float(fields[b"b"])
    except (KeyError, ValueError):
        raise Unusable("a bar without a number") from None
    if not math.isfinite(bar):
        raise Unusable("a bar that is not finite")
    return Event(op, origin, key, bar=bar)


def read_events(items: list[tuple[bytes, dict[bytes, bytes]]]) -> list[tuple[str, Event | str]]:
    """Each stream entry's id and its event, or why the tail cannot apply it (it skips that
    one in its place)."""
    out: list[tuple[str, Event | str]] = []
    for ident, fields in items:
        try:
            out.append((ident.decode(), parse(fields)))
        except Unusable as exc:
            out.append((ident.decode(), str(exc)))
    return out
