"""The purge stream's records as the fan-out's tail reads them (cache.purge_fanout): the
selector each one announces, or why the tail cannot apply it. Reading only.

Every version wrote the route, model and tenant fields (empty for "any"); a record without
them, or with a field that is not UTF-8, was written by hand or is junk. Before, one without
them read as a purge of everything (one XADD emptied every process's memory tier), and one
that was not UTF-8 failed the tail's read like a Redis outage.
"""

from __future__ import annotations

from dataclasses import dataclass

from cache.keys import Selector
from cache.stream_fields import Unusable, text

_SELECTOR = (b"r", b"m", b"t")


@dataclass(frozen=True, slots=True)
class Announcement:
    origin: str
    selector: Selector
    pending: bool  # its Redis part was not confirmed: readers delete (or purge) it too


def parse(fields: dict[bytes, bytes]) -> Announcement:
    """The announcement in a stream record's fields; Unusable for one the tail cannot apply."""
    missing = [f.decode() for f in _SELECTOR if f not in fields]
    if missing:
        raise Unusable(f"no {', '.join(missing)} field (route, model, tenant)")
    route_h, model_h, tenant_h = (text(fields, f) or None for f in _SELECTOR)
    # (a record without `k` is a selector of route, model and tenant: more of that one
    # tenant's entries, never another's)
    key = text(fields, b"k") or None
    selector = Selector(route_h, model_h, tenant_h, key)
    return Announcement(text(fields, b"o") or "", selector, fields.get(b"p") == b"1")
