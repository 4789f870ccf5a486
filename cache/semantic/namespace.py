"""Semantic namespaces: a hash of everything that defines the answer except the semantic text.

Model, route, tenant, system prompt, earlier turns, tools and sampling parameters all go in
(via Call.context), so a hit is only possible between calls that differ in their last question.
"""

from __future__ import annotations

import hashlib
from typing import Any

from cache.keys import canonical


def namespace_of(route: str, model: str | None, context: Any, tenant: str = "") -> str:
    """blake2b-128 hex of (route, model, tenant, context), the context in the exact key's
    canonical form (cache.keys.canonical: sorted keys, 0.0 as 0, JSON and msgpack alike), so
    two calls share a namespace only where their keys would read the rest of the request as
    one. (The namespace once spelled a msgpack bin value as its hex, the same as a string of
    those hex digits: a JSON system prompt "416e73..." shared the namespace of a msgpack one
    holding the bytes "Ans...", which the key keeps apart.) A lone surrogate in a system prompt
    or an earlier turn (JSON allows "\\ud800") is encoded as the key encodes it."""
    doc = [route, model or "", tenant, context]
    return hashlib.blake2b(canonical(doc), digest_size=16).hexdigest()
