"""Tenant identity: which client a cached answer belongs to, hashed with a deployment secret.

A tenant is the set of credential headers a request carries: the ones every client of these
APIs sends (Authorization, api-key, x-api-key, OpenAI-Organization, OpenAI-Project, the
Anthropic SDK's anthropic-workspace-id and anthropic-user-profile-id, Google's x-goog-api-key
and x-goog-user-project, Azure API Management's Ocp-Apim-Subscription-Key), Cookie (a session cookie
is a browser's or an auth proxy's credential) plus a route's configured
extras (e.g. X-Tenant). Two requests share cached answers only when all of
them are equal; a request with none of them is the anonymous tenant. The identity is only ever
fed to a keyed blake2b, so neither keys nor Redis contents reveal a credential, and a guessed
credential cannot be checked against them without the secret.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from typing import Any

log = logging.getLogger("latentgate.cache.tenant")

# Sent by OpenAI, Azure OpenAI and Anthropic-style clients; always part of the identity.
# anthropic-workspace-id (`messages.create(workspace_id=...)`, `AnthropicAWS(workspace_id=...)`)
# selects which Workspace one credential acts in, as OpenAI-Project does for a key: its files,
# skills and containers are that Workspace's. anthropic-user-profile-id names the party a
# request is made for. Either way one API key is several tenants.
BUILTIN_HEADERS = (
    "authorization",
    "api-key",
    "x-api-key",
    "openai-organization",
    "openai-project",
    "anthropic-workspace-id",
    "anthropic-user-profile-id",
    # A session cookie authenticates as a bearer token does (browsers, auth proxies in front
    # of passthrough routes): an answer to sid=alice without Vary or private was served to
    # sid=bob. RFC 9111 allows it; a gateway that promises tenants never share must not.
    "cookie",
    # Gemini's key header (google-genai sends it; the key picks the project whose files, cached
    # contents and tuned models a request reads), the project an OAuth token acts in (google-auth
    # sends a credential's quota project so), and Azure API Management's subscription key (Azure
    # OpenAI behind APIM: the subscription picks the product, quota and deployment)
    "x-goog-api-key",
    "x-goog-user-project",
    "ocp-apim-subscription-key",
)
SECRET_ENV = "LATENTGATE_TENANT_SECRET"
_MIN_SECRET_BYTES = 16
_DIGEST = 16
_SHORT = 8


def credential_headers(extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The built-in credential headers and a route's extras: lower-case, unique, sorted."""
    return tuple(sorted({*BUILTIN_HEADERS, *(h.strip().lower() for h in extra if h.strip())}))


def _values(headers: Mapping[str, str], name: str) -> list[str]:
    getall = getattr(headers, "getall", None)
    if getall is not None:
        return list(getall(name, []))
    # plain dicts (tests, purge bodies): names are matched without regard to case
    return [v for k, v in headers.items() if k.lower() == name]


def _underscored(headers: Mapping[str, str], wanted: Sequence[str]) -> list[tuple[str, list[str]]]:
    """Headers spelled with "_" where a credential header has "-" (`x_api_key`), under their own
    lower-case names. A CGI-style server (a WSGI bridge such as a2wsgi, cheroot, uWSGI) reads
    both spellings as one variable, HTTP_X_API_KEY, so its upstream may take either as the
    credential; counted under its own name, the odd spelling is a tenant of its own."""
    found: dict[str, list[str]] = {}
    for k in headers:  # names only (a multidict yields a repeated one again)
        if "_" not in k:
            continue
        name = k.lower()
        if name not in found and name not in wanted and name.replace("_", "-") in wanted:
            found[name] = _values(headers, name)
    return list(found.items())


def _safe(value: str) -> str:
    # aiohttp keeps undecodable header bytes as surrogates; this maps them one-to-one onto
    # characters that encode anywhere (latin-1 of the raw bytes), so no caller can fail on them.
    return value.encode("utf-8", "surrogateescape").decode("latin-1")


def tenant_of(
    headers: Mapping[str, str] | None, names: Sequence[str] = (), *, resolved: bool = False
) -> str:
    """The identity string of a request: every credential header present (built-ins + `names`),
    each value length-prefixed so no value can shift into its neighbour. "" = no credentials.
    `resolved`: `names` already is `credential_headers(...)`'s answer (hot callers keep it)."""
    if headers is None:
        return ""
    wanted = names if resolved else credential_headers(names)
    getall = getattr(headers, "getall", None)
    if getall is not None:
        # a multidict (case-insensitive): `in` skips the absent ones, most of them, cheaply
        present = [(name, getall(name)) for name in wanted if name in headers]
    else:
        present = [(name, _values(headers, name)) for name in wanted]
    respelled = _underscored(headers, wanted)
    if respelled:
        present = sorted([*present, *respelled], key=lambda item: item[0])
    parts = []
    for name, values in present:
        for value in values:
            v = _safe(value)
            parts.append(f"{name}:{len(v)}:{v}")
    return "\n".join(parts)


class TenantHasher:
    """Keyed blake2b over identity strings; one per process, built from the deployment secret."""

    __slots__ = ("_key",)

    def __init__(self, secret: bytes) -> None:
        # blake2b takes keys up to 64 bytes; a longer secret is reduced to 64 first
        self._key = secret if len(secret) <= 64 else hashlib.blake2b(secret).digest()

    def digest(self, identity: str) -> bytes:
        return hashlib.blake2b(
            identity.encode("utf-8", "surrogatepass"), key=self._key, digest_size=_DIGEST
        ).digest()

    def short(self, identity: str) -> str:
        """The tenant field of a key string and of a semantic namespace."""
        return self.digest(identity)[:_SHORT].hex()


def identity_from_purge(value: Any) -> str | None:
    """A purge body's tenant: {header: value} as a client sends them, or a bare Authorization
    value; None when it is neither (the caller answers 400)."""
    if isinstance(value, str):
        return tenant_of({"authorization": value})
    if isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        return tenant_of(value, list(value))
    return None


def resolve_secret(configured: str | None, environ: Mapping[str, str] | None = None) -> bytes:
    """The deployment secret: the config's, else the environment's, else a fresh random one
    (logged: it lives only as long as this process, so entries in a shared Redis written under
    it cannot be read by sidecars or by the next start)."""
    env = os.environ if environ is None else environ
    value = configured or env.get(SECRET_ENV) or ""
    if value:
        raw = value.encode()
        if len(raw) < _MIN_SECRET_BYTES:
            log.warning(
                "cache.tenant_secret is %d bytes; use at least %d random bytes",
                len(raw),
                _MIN_SECRET_BYTES,
            )
        return raw
    log.warning(
        "no cache.tenant_secret or %s: generated a random tenant secret for this process; "
        "cached answers in a shared Redis are not readable by other sidecars or after a restart",
        SECRET_ENV,
    )
    return secrets.token_bytes(32)


def share_generated_secret(configured: str | None, environ: MutableMapping[str, str]) -> None:
    """Before forking workers: without a configured secret, generate one into the environment so
    every worker of this server (and every config reload) hashes tenants the same way."""
    if configured or environ.get(SECRET_ENV):
        return
    environ[SECRET_ENV] = secrets.token_hex(32)
    log.warning(
        "no cache.tenant_secret or %s: generated one for this server's workers; set it to share "
        "cached answers in Redis with other sidecars or across restarts",
        SECRET_ENV,
    )
