"""Hot reload (SIGHUP and POST /admin/reload): re-read and validate the config, swap routes,
policies and backends in one assignment, and close replaced backends once their requests drained.

Listeners, limits, logging, tracing and cache stores are bound at start-up: a change to them is
reported as `restart_required` and the running values are kept.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import Counter, Gauge

from backends import Backend, BackendSettings
from cache import SECRET_ENV, Flows, SemanticSetup
from gateway.admin import guarded
from gateway.config import ConfigError, Settings, load_settings
from gateway.routing import Router
from gateway.runtime import Runtime
from gateway.state import STATE, AppState

log = logging.getLogger("latentgate.reload")

# Bound when the process starts: kept from the running config, reported if the file changed them.
_START_ONLY = ("listeners", "limits", "logging", "tracing", "cache")

RouterFactory = Callable[[Settings], Router]
BackendsFactory = Callable[[Mapping[str, BackendSettings]], dict[str, Backend]]
PolicySwap = Callable[[Settings], Flows]


@dataclass
class ReloadResult:
    ok: bool
    generation: int
    status: int = 200
    errors: list[dict[str, Any]] = field(default_factory=list)
    restart_required: list[str] = field(default_factory=list)
    backends_replaced: list[str] = field(default_factory=list)
    backends_kept: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "generation": self.generation,
            "errors": self.errors,
            "restart_required": self.restart_required,
            "backends_replaced": self.backends_replaced,
            "backends_kept": self.backends_kept,
            "seconds": round(self.seconds, 4),
        }


class Reloader:
    def __init__(
        self,
        state: AppState,
        config_path: str | None,
        build_router: RouterFactory,
        build_backends: BackendsFactory,
        swap_policies: PolicySwap | None = None,
    ) -> None:
        self.state = state
        self.config_path = config_path
        self.build_router = build_router
        self.build_backends = build_backends
        self.swap_policies = swap_policies
        self._lock = asyncio.Lock()
        self._retiring: set[asyncio.Task[None]] = set()
        self._echo: tuple[str | None, float] | None = None  # (file digest, until)
        registry = state.metrics.registry
        self.reloads = Counter(
            "latentgate_config_reloads",
            "Config reloads by result (ok, invalid, error)",
            ["result"],
            registry=registry,
        )
        for result in ("ok", "invalid", "error"):
            self.reloads.labels(result)
        self.generation = Gauge(
            "latentgate_config_generation",
            "Generation of the config being served (0 = as started)",
            registry=registry,
        )

    async def reload(self) -> ReloadResult:
        """Load the config file again; on any error keep serving the current generation."""
        async with self._lock:
            started = time.perf_counter()
            current = self.state.pipeline.runtime
            if self.config_path is None:
                self.reloads.labels("error").inc()
                return ReloadResult(
                    False,
                    current.generation,
                    409,
                    [
                        {
                            "path": "",
                            "line": None,
                            "message": "started without a config file: nothing to reload",
                        }
                    ],
                )
            try:
                new = await asyncio.to_thread(load_settings, self.config_path)
            except ConfigError as err:
                self.reloads.labels("invalid").inc()
                log.warning(
                    "reload rejected, still serving generation %d: %s", current.generation, err
                )
                return ReloadResult(
                    False,
                    current.generation,
                    422,
                    [{"path": i.path, "line": i.line, "message": i.message} for i in err.issues],
                )
            result = await self._swap(new, current)
            result.seconds = time.perf_counter() - started
            return result

    async def _swap(self, new: Settings, current: Runtime) -> ReloadResult:
        old = self.state.settings
        kept_settings = {
            k: getattr(old, k)
            for k in _START_ONLY
            if _effective(k, getattr(old, k)) != _effective(k, getattr(new, k))
        }
        if old.admin.listener != new.admin.listener:
            kept_settings["admin"] = new.admin.model_copy(update={"listener": old.admin.listener})
        merged = new.model_copy(update=kept_settings)
        merged, semantic_restart = semantic_kept(merged, self.state.semantic)
        reused = {
            name: current.backends[name]
            for name, spec in new.backends.items()
            if name in current.backends and old.backends.get(name) == spec
        }
        fresh: dict[str, Backend] = {}
        step = "backends"
        try:
            fresh = self.build_backends({n: s for n, s in new.backends.items() if n not in reused})
            router = self.build_router(merged)
            for backend in fresh.values():
                start = getattr(backend, "start", None)  # pools start their health checks
                if start is not None:
                    await start()
            step = "routes"  # the route caches' policies, in the same step
            flows = self.swap_policies(merged) if self.swap_policies is not None else current.flows
        except Exception as exc:  # a part that cannot be built must not take the gateway down
            self.reloads.labels("error").inc()
            log.exception(
                "reload failed while building its %s; still serving generation %d",
                step,
                current.generation,
            )
            # What this try built and started goes: before, a failure after the backends were
            # built left their health checks dialling replicas, and their sessions open, for
            # the process's life (and a route-cache failure answered 500).
            for backend in fresh.values():
                await backend.aclose()
            return ReloadResult(
                False,
                current.generation,
                422,
                [{"path": step, "line": None, "message": f"{type(exc).__name__}: {exc}"}],
            )
        backends: dict[str, Backend] = {**reused, **fresh}
        runtime = Runtime(router, backends, generation=current.generation + 1, flows=flows)
        # One assignment each, no await between them: a request sees all old or all new.
        self.state.pipeline.runtime = runtime
        self.state.backends = backends
        self.state.settings = merged
        retired = [b for name, b in current.backends.items() if reused.get(name) is not b]
        if retired:
            task = asyncio.create_task(self._retire(current, retired))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)
        self.reloads.labels("ok").inc()
        self.generation.set(runtime.generation)
        restart = sorted(k for k in kept_settings if k != "admin")
        if "admin" in kept_settings:
            restart.append("admin.listener")
        restart += semantic_restart
        log.info(
            "config reloaded: generation %d (%d backends replaced, %d kept)%s",
            runtime.generation,
            len(fresh),
            len(reused),
            f"; restart needed for {', '.join(restart)}" if restart else "",
        )
        return ReloadResult(
            True,
            runtime.generation,
            restart_required=restart,
            backends_replaced=sorted(fresh),
            backends_kept=sorted(reused),
        )

    async def _retire(self, old: Runtime, backends: list[Backend]) -> None:
        grace = self.state.settings.limits.shutdown_grace_s
        try:
            async with asyncio.timeout(grace):
                await old.idle.wait()
        except TimeoutError:
            log.warning(
                "generation %d still has %d requests after %.0fs; closing its backends",
                old.generation,
                old.in_flight,
                grace,
            )
        finally:
            # Also on shutdown (cancelled): replaced backends are closed exactly once, here.
            for backend in backends:
                await backend.aclose()
            self._drop_gone_series(backends)
            log.info("generation %d retired; %d old backends closed", old.generation, len(backends))

    def _drop_gone_series(self, retired: list[Backend]) -> None:
        """Per-replica gauges of replicas that no live backend serves are removed."""
        live: set[tuple[str, str]] = set()
        for b in self.state.backends.values():
            series = getattr(b, "replica_series", None)
            if series is not None:
                live |= series()
        for b in retired:
            series, drop = getattr(b, "replica_series", None), getattr(b, "drop_series", None)
            if series is not None and drop is not None:
                drop(series() - live)

    def expect_echo(self) -> None:
        """This worker reloaded on an admin call and asked the parent to SIGHUP every worker,
        itself included: that echo is skipped if the file is still the one it just loaded."""
        self._echo = (_file_digest(self.config_path), time.monotonic() + _ECHO_S)

    def _is_echo(self) -> bool:
        echo, self._echo = self._echo, None
        if echo is None or time.monotonic() > echo[1]:
            return False
        return echo[0] is not None and echo[0] == _file_digest(self.config_path)

    def schedule(self, why: str) -> None:
        """Start a reload from a signal handler; the outcome goes to the log."""

        async def run() -> None:
            if why == "SIGHUP" and self._is_echo():
                log.info("SIGHUP: this worker already serves this file (its admin reload)")
                return
            result = await self.reload()
            if not result.ok:
                log.error("%s reload rejected: %s", why, result.errors)

        task = asyncio.get_running_loop().create_task(run())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def aclose(self) -> None:
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)


RELOADER: web.AppKey[Reloader] = web.AppKey("latentgate_reloader", Reloader)
# how long the SIGHUP a worker's admin reload sends round to itself is expected
_ECHO_S = 10.0


def _file_digest(path: str | None) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else None
    except OSError:
        return None


def _effective(section: str, value: Any) -> Any:
    """A start-only section as it takes effect: the cache's tenant secret is the one the
    process hashes with, the configured one or else the one it generated into the environment
    at start (`${LATENTGATE_TENANT_SECRET:-}` in a file reads empty at start, and that one at
    a reload: the same secret, no restart)."""
    if section == "cache" and not value.tenant_secret:
        return value.model_copy(update={"tenant_secret": os.environ.get(SECRET_ENV) or None})
    return value


def semantic_kept(new: Settings, semantic: SemanticSetup | None) -> tuple[Settings, list[str]]:
    """A route's semantic stage is built at start-up (its verifier, bar, budget): a reload
    applies only turning it off. A route whose new semantic policy is on but differs from the
    running one keeps the running one (or stays without one), named in restart_required, so
    that /admin/config shows what serves."""
    running = semantic.routes if semantic is not None else {}
    restart, routes = [], []
    for r in new.routes:
        want = r.cache.semantic
        have = running.get(r.name)
        # (without the exact cache a route has no semantic stage, at start-up or after one)
        if want.enabled and r.cache.exact.enabled and (have is None or have.policy != want):
            restart.append(f"routes.{r.name}.cache.semantic")
            kept = have.policy if have is not None else want.model_copy(update={"enabled": False})
            r = r.model_copy(update={"cache": r.cache.model_copy(update={"semantic": kept})})
        routes.append(r)
    if not restart:
        return new, []
    return new.model_copy(update={"routes": routes}), restart


async def admin_reload(request: web.Request) -> web.Response:
    result = await request.app[RELOADER].reload()
    tell = request.app[STATE].tell_workers
    if result.ok and tell is not None:
        request.app[RELOADER].expect_echo()
        tell(signal.SIGHUP)  # the other workers reload the same file (as on a SIGHUP)
    status = result.status
    body: Mapping[str, Any] = result.as_json()
    if not result.ok:
        body = {
            "error": {
                "message": "config rejected; the running config keeps serving",
                "type": "invalid_config",
                "param": None,
                "code": status,
            },
            **body,
        }
    return web.json_response(body, status=status)


def register(
    app: web.Application,
    config_path: str | None,
    build_router: RouterFactory,
    build_backends: BackendsFactory,
    swap_policies: PolicySwap | None = None,
) -> None:
    """Wire the reloader into an app built by build_app (before the catch-all route)."""
    reloader = Reloader(app[STATE], config_path, build_router, build_backends, swap_policies)
    app[RELOADER] = reloader

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        yield
        await reloader.aclose()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_post("/admin/reload", guarded(admin_reload))
