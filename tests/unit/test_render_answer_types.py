"""gateway/render.py: an entry whose Content-Type is not an answer its route serves is never
rendered for a client, so one stored by a sidecar of an older version (sharing the Redis in a
rolling upgrade) is a miss, whose fresh answer replaces it, not a page replayed to everyone."""

from __future__ import annotations

import json

from cache import CacheEntry
from gateway.render import Framing

PAGE = b"<html><body>Sign in to the hotel Wi-Fi</body></html>"
CHAT = json.dumps({"object": "chat.completion", "choices": [], "usage": {}}).encode()


def _entry(content_type: str, body: bytes, kind: str) -> CacheEntry:
    return CacheEntry(200, [("Content-Type", content_type)], body=body, kind=kind)


def test_an_html_entry_on_a_json_route_serves_no_one() -> None:
    assert not Framing(kind="chat").serves(_entry("text/html", PAGE, "chat"))
    assert not Framing(kind="infer").serves(_entry("text/plain", PAGE, "infer"))
    assert Framing(kind="chat").serves(_entry("application/json; charset=utf-8", CHAT, "chat"))
    assert Framing(kind="infer").serves(_entry("application/octet-stream", b"\0", "infer"))


def test_a_passthrough_entry_of_any_type_still_serves() -> None:
    assert Framing(kind="raw").serves(_entry("text/html", PAGE, "raw"))
