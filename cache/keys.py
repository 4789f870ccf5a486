"""Exact-cache keys: canonical JSON of the answer-changing fields, tenant hashing, blake2b-128.

A key string is `<route>.<model>.<tenant>.<digest>`: three short hashes that let a purge find
entries by route, model or tenant with a prefix pattern, then the 128-bit digest of everything.
The tenant (cache/tenant.py) enters both only through a hash keyed with the deployment secret;
credential values are never stored.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cache.tenant import BUILTIN_HEADERS, TenantHasher, credential_headers, tenant_of

__all__ = [
    "CacheKey",
    "KeyBuilder",
    "Selector",
    "canonical",
    "key_scope",
    "normalise",
    "short_hash",
    "tenant_of",
]

# Short hashes only locate entries for purges; the full digest decides identity.
_SHORT = 8
_DIGEST = 16
_LONG_TEXT = 64 << 10


def normalise(value: Any) -> Any:
    """Same content → same structure: integral floats become ints, bytes become tagged hex."""
    if isinstance(value, dict):
        return {_escaped(str(k)): normalise(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [normalise(v) for v in value]
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        return value
    if isinstance(value, str) and len(value) > _LONG_TEXT:
        # Megabytes of text would be copied through json.dumps holding the GIL; its digest (which
        # blake2b computes with the GIL released) identifies it as well.
        data = value.encode("utf-8", "surrogatepass")
        return {"\x00str": hashlib.blake2b(data, digest_size=_DIGEST).hexdigest()}
    if isinstance(value, (bytes, bytearray, memoryview)):
        # msgpack's bin type has no JSON twin; a tagged form keeps it apart from any string.
        return {"\x00bin": hashlib.blake2b(bytes(value), digest_size=_DIGEST).hexdigest()}
    return value


def _escaped(key: str) -> str:
    """A client's key that starts with NUL gets one more: the tagged forms above ("\x00str",
    "\x00bin") start with exactly one, so no request body can spell a digested value (a
    client that sent {"\x00str": <digest of a long text>} shared that text's key)."""
    return "\x00" + key if key.startswith("\x00") else key


def canonical(value: Any) -> bytes:
    """Sorted keys, no whitespace, 1 == 1.0; JSON and msgpack of the same content agree."""
    return json.dumps(
        normalise(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode("utf-8", "surrogatepass")


def short_hash(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=_SHORT).hexdigest()


@dataclass(frozen=True, slots=True)
class CacheKey:
    """A request's identity in the store; `value` is what tiers index by. `generation`: the
    memory tier's purge generation when the request's key was built (None: not known), so an
    answer whose call began before a purge is not stored after it (RouteCache.store)."""

    value: str
    route_h: str
    model_h: str
    tenant_h: str
    generation: int | None = field(default=None, compare=False)
    scope_h: str = ""  # the route's key policy, when it is not the default (key_scope)

    @property
    def tenant_scope(self) -> str:
        """The tenant as the semantic stage partitions by it (its namespaces, its labels):
        the tenant hash, and the key policy it was told apart under (see key_scope)."""
        return f"{self.tenant_h}.{self.scope_h}" if self.scope_h else self.tenant_h


def key_scope(
    tenant_headers: Iterable[str], ignore_fields: Iterable[str], upstream: str = ""
) -> str:
    """What a route's key policy and upstream add to its keys: "" for the default policy (no
    extra credential header, no ignored field) with no upstream named.

    upstream: what the route's answers come from (the gateway names its backend, and a local
    engine's model): a reload or a sidecar that sends the route to another backend shares no
    entry with it, so one model's answers are not served as another's.

    Two gateways on one Redis (a rollout, a config drift) or one reloaded with a new policy
    build one key for two requests when their policies differ: with `tenant_headers:
    [X-Tenant]` a request without X-Tenant is the anonymous tenant, and it was a hit on the
    entry another sidecar, which does not count X-Tenant, had stored for `X-Tenant: t1`;
    likewise a field one ignores and the other keys. Keyed, the two policies share nothing."""
    extra = sorted(set(credential_headers(tenant_headers)) - set(BUILTIN_HEADERS))
    ignored = sorted(set(ignore_fields))
    if not extra and not ignored and not upstream:
        return ""
    scope: dict[str, Any] = {"tenant_headers": extra, "ignore_fields": ignored}
    if upstream:  # (absent otherwise: scopes without one kept their keys)
        scope["upstream"] = upstream
    return json.dumps(scope, sort_keys=True)


class KeyBuilder:
    """Builds keys for one route; the route's hash is computed once."""

    __slots__ = (
        "_hasher",
        "_identity_names",
        "_route",
        "_route_h",
        "_scope",
        "_scope_h",
        "_tenant_headers",
    )

    def __init__(
        self,
        route: str,
        tenant_headers: Sequence[str],
        hasher: TenantHasher,
        ignore_fields: Iterable[str] = (),
        upstream: str = "",
    ) -> None:
        """tenant_headers: the route's extra credential headers (the built-in ones always count);
        ignore_fields: the body fields its adapter leaves out of the key; upstream: what its
        answers come from (key_scope)."""
        self._route = route
        self._route_h = short_hash(route)
        self._tenant_headers = tuple(tenant_headers)
        self._identity_names = credential_headers(self._tenant_headers)
        self._hasher = hasher
        self._scope = key_scope(self._tenant_headers, ignore_fields, upstream).encode()
        self._scope_h = short_hash(self._scope.decode()) if self._scope else ""

    def build(
        self,
        model: str | None,
        key_fields: Any,
        headers: Mapping[str, str] | None,
        generation: int | None = None,
    ) -> CacheKey:
        tenant = self._hasher.digest(tenant_of(headers, self._identity_names, resolved=True))
        model_s = model or ""
        h = hashlib.blake2b(digest_size=_DIGEST)
        # Length-prefixed parts: no value can shift bytes into its neighbour.
        parts = [self._route.encode(), model_s.encode("utf-8", "surrogatepass"), tenant]
        if self._scope:  # (a fourth length-prefixed part: canonical JSON holds no NUL byte)
            parts.append(self._scope)
        for part in parts:
            h.update(len(part).to_bytes(4, "little"))
            h.update(part)
        h.update(canonical(key_fields))
        model_h = short_hash(model_s)
        tenant_h = tenant[:8].hex()
        value = f"{self._route_h}.{model_h}.{tenant_h}.{h.hexdigest()}"
        return CacheKey(value, self._route_h, model_h, tenant_h, generation, self._scope_h)


@dataclass(frozen=True, slots=True)
class Selector:
    """Which entries a purge removes: every given field must match; none given = all. `key`:
    that one entry alone (an unsafe request's invalidation, RFC 9111 4.4); the three hashes
    are then its own, so a reader that knows only those drops no other tenant's entries."""

    route_h: str | None = None
    model_h: str | None = None
    tenant_h: str | None = None
    key: str | None = None

    @classmethod
    def one(cls, key: CacheKey) -> Selector:
        return cls(key.route_h, key.model_h, key.tenant_h, key.value)

    @classmethod
    def of_value(cls, value: str) -> Selector | None:
        """The one-entry selector of a stored key's value (None: not a key this cache built)."""
        parts = value.split(".", 3)
        return cls(parts[0], parts[1], parts[2], value) if len(parts) == 4 else None

    @classmethod
    def of(
        cls,
        route: str | None = None,
        model: str | None = None,
        tenant: str | None = None,
        hasher: TenantHasher | None = None,
    ) -> Selector:
        """tenant: an identity string (cache.tenant.tenant_of), hashed as keys hash it."""
        if tenant is not None and hasher is None:
            raise ValueError("a tenant selector needs the deployment's TenantHasher")
        return cls(
            short_hash(route) if route is not None else None,
            short_hash(model) if model is not None else None,
            hasher.short(tenant) if tenant is not None and hasher is not None else None,
        )

    @classmethod
    def of_pattern(cls, pattern: str) -> Selector | None:
        """The selector whose `pattern()` this is (None: not one, or a one-key selector's)."""
        parts = pattern.split(".")
        if len(parts) != 4 or parts[3] != "*" or not all(parts):
            return None
        route_h, model_h, tenant_h = (None if p == "*" else p for p in parts[:3])
        return cls(route_h, model_h, tenant_h)

    def matches(self, key: str) -> bool:
        if self.key is not None:
            return key == self.key
        r, m, t, _ = key.split(".", 3)
        return (
            (self.route_h is None or self.route_h == r)
            and (self.model_h is None or self.model_h == m)
            and (self.tenant_h is None or self.tenant_h == t)
        )

    def pattern(self) -> str:
        """A Redis glob over key strings (hashes are hex, so no escaping is needed)."""
        if self.key is not None:
            return self.key
        return f"{self.route_h or '*'}.{self.model_h or '*'}.{self.tenant_h or '*'}.*"
