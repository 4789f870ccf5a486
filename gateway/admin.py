"""Operational endpoints: /healthz, /readyz, /metrics, and the bearer-token guarded /admin API."""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable

from aiohttp import web

from cache import identity_from_purge
from gateway import worker_stats
from gateway.codings import read_body
from gateway.errors import BadRequest, GatewayError, NotFound, Unauthorized, error_body
from gateway.readiness import readiness
from gateway.redact import settings_view
from gateway.state import STATE, AppState

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(
        status=status, body=json.dumps(data).encode(), content_type="application/json"
    )


async def healthz(request: web.Request) -> web.Response:
    return _json({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    ready, body = await readiness(request.app[STATE])
    return _json(body, 200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.worker_metrics is not None:  # --workers N: every worker's series
        body = await state.worker_metrics.render()
    else:
        body = state.metrics.render()
    return web.Response(
        body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
    )


def check_admin(state: AppState, request: web.Request) -> None:
    """Constant-time bearer check; an unset token disables the admin API rather than opening it."""
    token = state.settings.admin.token
    given = request.headers.get("Authorization", "")
    if not token:
        raise Unauthorized("the admin API is disabled: set admin.token or LATENTGATE_ADMIN_TOKEN")
    if not given.startswith("Bearer ") or not hmac.compare_digest(
        given[7:].encode(), token.encode()
    ):
        raise Unauthorized("missing or wrong admin bearer token")


def guarded(handler: Handler) -> Handler:
    async def wrapper(request: web.Request) -> web.StreamResponse:
        try:
            check_admin(request.app[STATE], request)
            return await handler(request)
        except GatewayError as err:
            return web.Response(
                status=err.status,
                body=error_body("admin", err),
                content_type="application/json",
                headers={"WWW-Authenticate": "Bearer"} if err.status == 401 else None,
            )

    return wrapper


async def admin_backends(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return _json({name: b.describe() for name, b in state.backends.items()})


async def admin_config(request: web.Request) -> web.Response:
    return _json(settings_view(request.app[STATE].settings))


async def admin_cache_stats(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.cache is None:
        raise NotFound("no cache is configured")
    own = await state.cache.stats()
    if state.worker_metrics is not None:  # --workers N: every worker's, summed
        return _json(await worker_stats.gather(state.worker_metrics.workers, own))
    return _json(own)


async def admin_cache_purge(request: web.Request) -> web.Response:
    """Body: {"route": r} | {"model": m} | {"tenant": t} (any combination, all must match)
    | {"all": true}.

    tenant is the credential headers as clients send them, {"Authorization": "Bearer ..",
    "OpenAI-Organization": ".."} (every one the entries were stored with), or a bare Authorization
    value; it is hashed here exactly as keys hash it.
    """
    cache = request.app[STATE].cache
    if cache is None:
        raise NotFound("no cache is configured")
    try:
        doc = json.loads(await read_body(request) or b"{}")
    except (ValueError, RecursionError):  # JSON, UTF-8, or an integer out of range
        raise BadRequest("the purge body must be a JSON object") from None
    if not isinstance(doc, dict) or set(doc) - {"route", "model", "tenant", "all"}:
        raise BadRequest("the purge body takes route, model, tenant or all")
    if not utf8(doc):
        raise BadRequest("the purge body holds a string that is not valid Unicode")
    tenant = None
    if doc.get("tenant") is not None:
        tenant = identity_from_purge(doc["tenant"])
        if tenant is None:
            raise BadRequest("tenant must be {header: value} or an Authorization value (string)")
    fields = {"route": doc.get("route"), "model": doc.get("model"), "tenant": tenant}
    if any(v is not None and not isinstance(v, str) for v in fields.values()):
        raise BadRequest("route and model must be strings")
    if all(v is None for v in fields.values()) and doc.get("all") is not True:
        raise BadRequest("say what to purge: route, model, tenant, or all: true")
    routes = [r.name for r in request.app[STATE].settings.routes]
    if fields["route"] is not None and fields["route"] not in routes:
        # a misspelt name purged nothing and answered 200, which read as done
        raise BadRequest(
            f"no route is named {fields['route']!r}; the routes are: {', '.join(routes)}",
            param="route",
        )
    # (with --workers N, the other workers' memory too, by this selector: Cache.siblings)
    purged = await cache.purge(**fields)
    # 202: Redis (or the announcement to the other processes) did not take it yet; this
    # process reads none of it from Redis meanwhile and runs it again once Redis answers
    pending = pending_parts(purged)
    if pending:
        return _json({"purged": purged, "pending": pending}, 202)
    return _json({"purged": purged})


def pending_parts(purged: dict[str, object]) -> list[str]:
    """The parts of a purge not done yet, each done later without being asked again: "redis"
    (its keys; none is read from there meanwhile) and "other_processes" (the announcement)."""
    out = ["redis"] if isinstance(purged.get("redis"), dict) else []
    told = str(purged.get("other_processes", "announced"))
    if told != "announced":  # not announced (skipped or failed), or still on its way
        out.append("other_processes")
    return out


def utf8(value: object) -> bool:
    """Every string in a decoded JSON body is UTF-8-encodable (JSON's \ud800 escape decodes
    to a lone surrogate, which hashing and Redis keys cannot take). Iterative: a body nested
    as deep as the JSON decoder allows must not exhaust the stack here."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return False
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return True


def register(app: web.Application) -> None:
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/admin/backends", guarded(admin_backends))
    app.router.add_get("/admin/config", guarded(admin_config))
    app.router.add_get("/admin/cache/stats", guarded(admin_cache_stats))
    app.router.add_post("/admin/cache/purge", guarded(admin_cache_purge))
