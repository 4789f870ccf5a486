"""Semantic namespaces: a hash of everything that defines the answer except the semantic text.

Model, route, tenant, system prompt, earlier turns, tools and sampling parameters all go in
(via Call.context), so a hit is only possible between calls that differ in their last question.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any


def _canonical(value: Any) -> Any:
    """JSON-stable form: sorted keys, integral floats as ints (0.0 and 0 mean one thing)."""
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, bytes):
        return value.hex()
    return value


def namespace_of(route: str, model: str | None, context: Any, tenant: str = "") -> str:
    """blake2b-128 hex of (route, model, tenant, canonical context)."""
    doc = [route, model or "", tenant, _canonical(context)]
    raw = json.dumps(doc, separators=(",", ":"), ensure_ascii=False, default=str)
    # surrogatepass: a lone surrogate in a system prompt or an earlier turn (JSON allows
    # "\ud800") must not fail the lookup; the exact key encodes the same way (cache.keys)
    return hashlib.blake2b(raw.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
