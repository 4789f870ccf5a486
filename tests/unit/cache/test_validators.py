"""If-None-Match against a stored ETag (cache.validators): weak comparison, lists read tag by
tag (a tag may hold a comma), `*` for any stored answer, and only GET/HEAD with no other
precondition evaluated by the cache."""

from __future__ import annotations

import pytest

from cache.validators import evaluated_here, not_modified


@pytest.mark.parametrize(
    ("inm", "etag", "matches"),
    [
        ('"a"', '"a"', True),
        ('W/"a"', '"a"', True),
        ('"a"', 'W/"a"', True),
        ('"x", "a,b"', '"a,b"', True),
        ('"a,b"', '"a"', False),
        ("*", None, True),
        ('"a"', None, False),
        ('"a"', "a", False),  # not an entity-tag: nothing matches it
        ("a", '"a"', False),
    ],
)
def test_not_modified(inm: str, etag: str | None, matches: bool) -> None:
    assert not_modified(inm, etag) is matches


def test_evaluated_here() -> None:
    assert evaluated_here("GET", {"If-None-Match"})
    assert evaluated_here("HEAD", {"If-None-Match", "If-Modified-Since"})
    assert not evaluated_here("POST", {"If-None-Match"})
    assert not evaluated_here("GET", {"If-None-Match", "Range"})
    assert not evaluated_here("GET", {"If-Modified-Since"})
