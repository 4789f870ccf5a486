"""Fields of an entry in one of the fleet's Redis Streams (the purge fan-out's, the semantic
sync's), as a tail reads them: text, or `Unusable` for an entry the tail cannot apply. Anyone
with write access can XADD to a stream, and another version may write fields this one does not
know; such an entry is skipped where it lies, never mistaken for a Redis failure."""

from __future__ import annotations


class Unusable(ValueError):
    """An entry the tail cannot apply; the message says why."""


def text(fields: dict[bytes, bytes], name: bytes) -> str | None:
    """The field as text; None when absent; Unusable when it is not UTF-8."""
    raw = fields.get(name)
    if raw is None:
        return None
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise Unusable(f"its {name.decode()!r} is not UTF-8") from None
