"""If-None-Match against a stored answer's ETag (RFC 9110 13.1.2, 8.8.3): whether the cache may
answer a conditional GET or HEAD itself, with a 304, instead of sending it upstream.

Plain strings, as the rest of the cache's HTTP rules (cache/policy.py); no HTTP objects.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from cache.policy import CONDITIONAL_HEADERS

# An entity-tag (RFC 9110 8.8.3): an optional weakness mark, then a quoted opaque tag, which
# may hold a comma, so a list is read tag by tag, not split on commas.
_TAG = re.compile(r'(?:W/)?"([^"]*)"')
# The preconditions the cache evaluates against its entry: If-None-Match, and If-Modified-Since,
# which a recipient ignores beside it (RFC 9110 13.1.3). Any other (a Range, If-Match, ...) and
# the request goes upstream, as before.
_EVALUATED = frozenset({"If-None-Match", "If-Modified-Since"})


def evaluated_here(method: str, present: Collection[str]) -> bool:
    """Is this a GET or HEAD whose preconditions (`present`: the request's header names) the
    cache answers from its entry: If-None-Match, and no Range or other precondition?"""
    if method not in ("GET", "HEAD"):
        return False
    names = [h for h in CONDITIONAL_HEADERS if h in present]
    return "If-None-Match" in names and all(h in _EVALUATED for h in names)


def not_modified(if_none_match: str, etag: str | None) -> bool:
    """Does a stored answer with this ETag make the If-None-Match condition false, so that a GET
    or HEAD gets a 304? `*` is any stored answer; a listed tag matches by weak comparison (13.1.2:
    `W/"x"` and `"x"` match). A list that names no tag the answer has: its full answer."""
    if if_none_match.strip() == "*":
        return True
    own = _TAG.fullmatch(etag.strip()) if etag is not None else None
    if own is None:
        return False
    return own.group(1) in {m.group(1) for m in _TAG.finditer(if_none_match)}
