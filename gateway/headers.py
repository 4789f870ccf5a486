"""Header rules for a proxy: hop-by-hop removal (RFC 9110 7.6.1) and X-Forwarded-*."""

from __future__ import annotations

from collections.abc import Iterable

from multidict import CIMultiDict, CIMultiDictProxy

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Recomputed by whoever writes the next hop's framing.
_FRAMING = frozenset({"content-length", "host"})
# Built once: the hot path does one set lookup per header.
_DROP_UP = HOP_BY_HOP | _FRAMING
_DROP_UP_KEEP_LENGTH = HOP_BY_HOP | (_FRAMING - {"content-length"})
# The gateway names itself, without versions, on every response (as nginx does by default: an
# upstream's Server is not passed on). aiohttp's default, `Python/3.11 aiohttp/3.x.y`, told any
# client which versions to look up advisories for, and a hit and its miss named different
# servers (the upstream's, then aiohttp's).
SERVER = "latentgate"
_DROP_DOWN = HOP_BY_HOP | {"content-length", "server"}
_OURS = frozenset({"x-forwarded-proto", "x-forwarded-host"})


def _connection_tokens(value: str) -> frozenset[str]:
    return frozenset(t.strip().lower() for t in value.split(",") if t.strip())


_ACCEPT_ENCODING = frozenset({"accept-encoding"})
# Connection options that name no header of their own beyond the hop-by-hop ones always dropped
_PLAIN_OPTIONS = frozenset({"keep-alive", "close", "upgrade", "te"})


def nominated(headers: CIMultiDictProxy[str]) -> frozenset[str]:
    """The headers a request's Connection header makes hop-by-hop (RFC 9110 7.6.1), beyond
    those always dropped: they never reach the upstream or an engine."""
    if "Connection" not in headers:
        return frozenset()
    names = frozenset().union(*(_connection_tokens(v) for v in headers.getall("Connection")))
    return names - _PLAIN_OPTIONS


def end_to_end(headers: CIMultiDictProxy[str]) -> CIMultiDictProxy[str]:
    """The request's headers as the upstream (or an engine) gets them, for reading the body
    by: without those its Connection header nominates. A request that nominates Content-Type
    is read as the upstream reads it, whether its answer is cached or not."""
    named = nominated(headers)
    if not named:
        return headers
    return CIMultiDictProxy(
        CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in named)
    )


def upstream_headers(
    raw: Iterable[tuple[str, str]],
    *,
    client_ip: str | None,
    proto: str,
    host: str | None,
    keep_length: bool = False,
    identity: bool = False,
) -> list[tuple[str, str]]:
    """Headers for the upstream hop. `identity` asks for an uncompressed answer (cached routes:
    one stored entry must suit every client, whatever codings each accepts)."""
    drop = _DROP_UP_KEEP_LENGTH if keep_length else _DROP_UP
    if identity:
        drop = drop | _ACCEPT_ENCODING
    out: list[tuple[str, str]] = []
    prior_for: str | None = None
    named: frozenset[str] = frozenset()  # headers the client's Connection header names
    decoded = False
    for k, v in raw:
        lk = k.lower()
        if lk == "content-encoding":
            # aiohttp's server decodes the request body (gzip, deflate, br); what goes upstream
            # is the decoded body, so its coding's label (and its length) must not.
            decoded = decoded or v.strip().lower() not in ("", "identity")
            continue
        if lk in drop:
            if lk == "connection":
                named |= _connection_tokens(v)
            continue
        if lk == "x-forwarded-for":
            prior_for = v if prior_for is None else f"{prior_for}, {v}"
            continue
        if lk in _OURS:
            continue  # ours describe the hop we terminate
        out.append((k, v))
    if decoded and keep_length:
        named |= {"content-length"}  # a streamed decoded body goes chunked
    if named:
        out = [(k, v) for k, v in out if k.lower() not in named]
        if "x-forwarded-for" in named:
            prior_for = None
    if client_ip:
        out.append(("X-Forwarded-For", f"{prior_for}, {client_ip}" if prior_for else client_ip))
    elif prior_for:
        out.append(("X-Forwarded-For", prior_for))
    out.append(("X-Forwarded-Proto", proto))
    if host:
        out.append(("X-Forwarded-Host", host))
    if identity:
        out.append(("Accept-Encoding", "identity"))
    return out


def downstream_headers(raw: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    named: frozenset[str] = frozenset()
    for k, v in raw:
        lk = k.lower()
        if lk in _DROP_DOWN:
            if lk == "connection":
                named |= _connection_tokens(v)
            continue
        out.append((k, v))
    if named:
        out = [(k, v) for k, v in out if k.lower() not in named]
    return out


def field(headers: CIMultiDict[str] | CIMultiDictProxy[str], name: str) -> str | None:
    """A field's lines combined into one list (RFC 9110 5.3): `Cache-Control: max-age=600`
    then `Cache-Control: no-store` is one request that must not be stored."""
    values = headers.getall(name, [])
    return ", ".join(values) if values else None
