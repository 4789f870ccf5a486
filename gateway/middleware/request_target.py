"""The request line and headers made safe before routing: one path for routing and upstream.

- absolute-form targets (`GET http://host/p HTTP/1.1`, RFC 9112 3.2.2) are served as their
  origin form (`/p`), which is what aiohttp routes on; authority- and asterisk-form → 400;
- dot segments (`/v1/x/../chat/completions`, also percent-encoded) are removed as RFC 3986
  5.2.4 says, so the route matched and the path sent upstream are the same; a path whose
  decoded form still has them (an encoded slash: `..%2F`) is refused;
- a header value that is not UTF-8 → 400 (401 on /admin): credentials are hashed and compared
  as text, and no answer may depend on how undecodable bytes happen to be read.
"""

from __future__ import annotations

from urllib.parse import unquote

from aiohttp import web
from aiohttp.typedefs import Handler
from yarl import URL

from gateway.errors import BadRequest, GatewayError, Unauthorized, error_body

_DOTS = frozenset({".", ".."})


def _error(err: GatewayError, admin: bool) -> web.Response:
    headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
    return web.Response(
        status=err.status,
        body=error_body("admin" if admin else "openai", err),
        content_type="application/json",
        headers=headers,
    )


def remove_dot_segments(raw_path: str) -> str:
    """RFC 3986 5.2.4 over raw (still percent-encoded) segments; `%2e%2e` counts as `..`."""
    out: list[str] = []
    segments = raw_path.split("/")[1:]
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        decoded = unquote(seg) if "%" in seg else seg
        if decoded == "..":
            if out:
                out.pop()
            if last:
                out.append("")
        elif decoded == ".":
            if last:
                out.append("")
        else:
            out.append(seg)
    return "/" + "/".join(out)


def _has_dot_segment(path: str) -> bool:
    return any(s in _DOTS for s in path.split("/"))


def undecodable_header(request: web.Request) -> str | None:
    """The name of the first header whose value is not UTF-8, or None."""
    for name, value in request.raw_headers:
        if not value.isascii():
            try:
                value.decode("utf-8")
            except UnicodeDecodeError:
                return name.decode("latin-1")
    return None


def safe_raw_target(raw: str) -> str | GatewayError:
    """The origin-form, dot-free raw target to serve, or why it cannot be served."""
    if not raw.startswith("/"):
        if "://" not in raw:  # authority-form (CONNECT) or asterisk-form (OPTIONS *)
            return BadRequest(f"request target {raw[:100]!r} is not served")
        try:
            origin = URL(raw, encoded=True)
        except ValueError:
            return BadRequest("the absolute request target is not a valid URL")
        query = origin.raw_query_string
        raw = (origin.raw_path or "/") + (f"?{query}" if query else "")
    path_part, sep, query = raw.partition("?")
    if "/." in path_part or "%2e" in path_part.lower():
        path_part = remove_dot_segments(path_part)
        if _has_dot_segment(unquote(path_part)):
            return BadRequest("the request path has an encoded dot segment")
    return path_part + sep + query


@web.middleware
async def safe_target(request: web.Request, handler: Handler) -> web.StreamResponse:
    raw = request.raw_path
    admin = request.path.startswith("/admin")
    bad_header = undecodable_header(request)
    if bad_header is not None:
        msg = f"header {bad_header} is not valid UTF-8"
        return _error(Unauthorized(msg) if admin else BadRequest(msg), admin)
    if raw.startswith("/") and "/." not in raw and "%2e" not in raw and "%2E" not in raw:
        return await handler(request)  # the usual target: nothing to change
    fixed = safe_raw_target(raw)
    if isinstance(fixed, GatewayError):
        return _error(fixed, admin)
    if fixed == raw:
        return await handler(request)
    # Routed again from the start on the safe target: the route that serves a request is the one
    # its upstream path names (aiohttp resolved the original target before any middleware ran).
    return await request.app._handle(request.clone(rel_url=URL(fixed, encoded=True)))


def install(app: web.Application) -> None:
    # first: routing, the admin split and every handler see the safe target
    app.middlewares.insert(0, safe_target)
