"""Header rules for a proxy: hop-by-hop removal (RFC 9110 7.6.1) and X-Forwarded-*."""

from __future__ import annotations

from collections.abc import Iterable

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
})
# Recomputed by whoever writes the next hop's framing.
_FRAMING = frozenset({"content-length", "host"})


def _connection_tokens(headers: Iterable[tuple[str, str]]) -> set[str]:
    tokens: set[str] = set()
    for k, v in headers:
        if k.lower() == "connection":
            tokens.update(t.strip().lower() for t in v.split(",") if t.strip())
    return tokens


def upstream_headers(
    raw: Iterable[tuple[str, str]], *, client_ip: str | None, proto: str, host: str | None,
    keep_length: bool = False,
) -> list[tuple[str, str]]:
    items = list(raw)
    drop = HOP_BY_HOP | _connection_tokens(items) | (_FRAMING - {"content-length"} if keep_length else _FRAMING)
    out: list[tuple[str, str]] = []
    prior_for: str | None = None
    for k, v in items:
        lk = k.lower()
        if lk in drop:
            continue
        if lk == "x-forwarded-for":
            prior_for = v if prior_for is None else f"{prior_for}, {v}"
            continue
        if lk in ("x-forwarded-proto", "x-forwarded-host"):
            continue  # ours describe the hop we terminate
        out.append((k, v))
    if client_ip:
        out.append(("X-Forwarded-For", f"{prior_for}, {client_ip}" if prior_for else client_ip))
    elif prior_for:
        out.append(("X-Forwarded-For", prior_for))
    out.append(("X-Forwarded-Proto", proto))
    if host:
        out.append(("X-Forwarded-Host", host))
    return out


def downstream_headers(raw: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    items = list(raw)
    drop = HOP_BY_HOP | _connection_tokens(items) | {"content-length"}
    return [(k, v) for k, v in items if k.lower() not in drop]
