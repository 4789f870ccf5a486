"""Process lifecycle: workers sharing the port, signals, and a graceful drain on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time

from aiohttp import web

from cache import Cache, share_generated_secret
from gateway import access_log, worker_drops, worker_stats
from gateway.app import build_app
from gateway.codings import SERVER_OPTIONS
from gateway.config import ListenerSettings, Settings
from gateway.connections import ConnectionGuard, GuardedAppRunner
from gateway.dispatch import model_traffic_handler
from gateway.early_signals import fork, remember_early
from gateway.grpc import GRPC
from gateway.listeners import CannotListen, bind_unix, make_sites
from gateway.middleware.listener_roles import ROLES
from gateway.reload import RELOADER
from gateway.state import STATE
from gateway.worker_metrics import WorkerMetrics, Workers

log = logging.getLogger("latentgate.server")
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


_STOP_REPEAT_S = 1.0  # how often the parent repeats a stop to workers that have not ended
# The repeat's signal: ignored by default (SIGTERM's default action would end a worker whose
# loop is already gone with "killed by signal 15", so exit 1), a stop once a worker's handlers
# are in. Nothing else sends it: SIGURG only comes for sockets that ask for it (F_SETOWN).
STOP_REPEAT = signal.SIGURG


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop()


async def serve(
    settings: Settings,
    unix_socks: dict[str, socket.socket] | None = None,
    reuse_port: bool = False,
    config_path: str | None = None,
    early: list[int] | None = None,
    workers: Workers | None = None,
) -> None:
    """early: the signals gateway.early_signals remembered before this process could act on
    them (see `run`); acted on once the handlers below are in place. workers: this one's place among
    --workers N (None: a single process)."""
    app = build_app(settings, config_path)
    state = app[STATE]
    if workers is not None:
        posts = {}
        cache = state.cache
        if cache is not None:  # (an invalidation goes by the fan-out when there is Redis)
            posts[worker_drops.PATH] = worker_drops.handler(cache.memory.purge)
            cache.siblings = worker_drops.SiblingDrops(workers).announce
            posts[worker_stats.PATH] = worker_stats.handler(cache.stats)
        state.worker_metrics = WorkerMetrics(workers, state.metrics.render, posts)
        await state.worker_metrics.start()
    grpc_listeners = app.get(GRPC)
    if grpc_listeners is not None:
        grpc_listeners.reuse_port = reuse_port
    limits = settings.limits
    runner = GuardedAppRunner(
        app,
        guard=ConnectionGuard(limits, state.metrics.registry),
        handler=model_traffic_handler(app),
        max_headers=limits.max_headers,
        handle_signals=False,
        **access_log.runner_options(settings.logging.access_log),
        keepalive_timeout=limits.client_idle_timeout_s,
        max_line_size=limits.max_header_bytes,
        max_field_size=limits.max_header_bytes,
        shutdown_timeout=limits.shutdown_grace_s,
        **SERVER_OPTIONS,  # request bodies decoded by gateway.codings, checked whole
    )
    try:
        await runner.setup()  # (starts a gRPC listener, when there is one)
    except OSError as exc:
        await runner.cleanup()
        raise CannotListen(str(exc)) from exc
    _tune_gc()
    sites = await _sites(runner, settings.listeners, unix_socks or {}, reuse_port)
    for site in sites:
        await _start(site, runner)
        log.info("listening on %s (pid %d)", site.name, os.getpid())
    if settings.admin.listener is not None:
        admin = [settings.admin.listener]
        for site in await _sites(runner, admin, unix_socks or {}, reuse_port):
            await _start(site, runner)
            app[ROLES].add_admin_site(site)
            sites.append(site)
            log.info("admin API listening on %s (pid %d)", site.name, os.getpid())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, app[RELOADER].schedule, "SIGHUP")
    if workers is not None:
        # the parent's repeat of a stop (`run`): SIGURG, whose default action is to ignore it,
        # so a repeat that comes before this handler, or after the loop is gone, is nothing
        loop.add_signal_handler(STOP_REPEAT, stop.set)
    if reuse_port:  # one of --workers N: admin calls reach the siblings through the parent
        parent = os.getppid()
        state.tell_workers = lambda sig: os.kill(parent, sig)
        # (always handled: SIGUSR1's default action would end the worker)
        loop.add_signal_handler(signal.SIGUSR1, _drop_memory, state.cache)
    # (read after the handlers are in: a signal now goes to them, one before is in the list)
    for signum in sorted(set(early or ())):
        if signum == signal.SIGHUP:
            app[RELOADER].schedule("SIGHUP during start-up")
        elif signum == signal.SIGUSR1 and reuse_port:
            _drop_memory(state.cache)
        elif signum in (signal.SIGTERM, signal.SIGINT):
            stop.set()
    await stop.wait()
    log.info(
        "draining: /readyz says 503 and new requests get 503 (listeners stay open); waiting up "
        "to %.0fs for %d in-flight requests",
        limits.shutdown_grace_s,
        state.pipeline.in_flight,
    )
    draining_since = time.monotonic()
    state.draining = True  # gateway.drain turns new route requests away from here on
    # The gRPC listener drains beside HTTP: new calls refused now, in-flight ones finish.
    grpc_drain = (
        asyncio.create_task(grpc_listeners.drain(limits.shutdown_grace_s))
        if grpc_listeners is not None
        else None
    )
    try:
        async with asyncio.timeout(limits.shutdown_grace_s):
            await state.pipeline.idle.wait()
    except TimeoutError:
        log.warning("grace period over with %d requests in flight", state.pipeline.in_flight)
    if grpc_drain is not None:
        await grpc_drain
    # what is left of the grace bounds the rest: answers still being written end with it
    runner.shutdown_within(limits.shutdown_grace_s - (time.monotonic() - draining_since))
    for site in sites:
        await site.stop()
    await runner.cleanup()
    if state.worker_metrics is not None:
        await state.worker_metrics.close()
    for lst in [*settings.listeners, settings.admin.listener]:
        if lst is not None and lst.unix is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lst.unix)
    log.info("stopped")


def _end_with_parent(parent: int) -> None:
    """A worker drains (SIGTERM) when the parent dies: a parent killed with SIGKILL (the OOM
    killer, `kill -9`) left its workers serving on the port as orphans, on the config they
    had, beside whatever was started next. Linux's PR_SET_PDEATHSIG; the SIGTERM is remembered
    until the worker's handlers are in (gateway.early_signals), like any other."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: no such call
        return
    if os.getppid() != parent:  # the parent died before the call: no signal will come
        os.kill(os.getpid(), signal.SIGTERM)


def _drop_memory(cache: Cache | None) -> None:
    """A purge another worker took: this worker's memory tier goes whole (Redis, if any, was
    purged by that worker; the semantic index drops entries whose payload is gone)."""
    if cache is None:
        return
    n = cache.memory.clear()
    log.info("purge in another worker: dropped %d entries from this worker's memory tier", n)


async def _sites(
    runner: web.AppRunner,
    listeners: list[ListenerSettings],
    unix_socks: dict[str, socket.socket],
    reuse_port: bool,
) -> list[web.BaseSite]:
    try:
        return make_sites(runner, listeners, unix_socks, reuse_port)
    except CannotListen:  # a unix socket that would not bind: what started is stopped first
        await runner.cleanup()
        raise


async def _start(site: web.BaseSite, runner: web.BaseRunner) -> None:
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise CannotListen(f"cannot listen on {site.name}: {exc.strerror or exc}") from exc


def _tune_gc() -> None:
    """Start-up objects (modules, settings, the app) never die: freeze them out of every scan.
    Requests leave almost no cyclic garbage, so young collections can run 20x less often."""
    gc.collect()
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(gen0, 14_000), gen1, gen2)


def run(
    settings: Settings,
    workers: int = 1,
    config_path: str | None = None,
    early: list[int] | None = None,
) -> int:
    """early: the list gateway.early_signals filled since the command started (None: remember
    from here on)."""
    # Before any fork: every worker must hash tenants with the same secret, or a worker could
    # neither read its siblings' entries in Redis nor purge them.
    share_generated_secret(settings.cache.tenant_secret, os.environ)
    # (acted on once the handlers are in: serve's `early`, the parent's forward below)
    if early is None:
        early = remember_early()
    if workers <= 1:
        try:
            with asyncio.Runner(loop_factory=_new_loop) as runner:
                runner.run(serve(settings, config_path=config_path, early=early))
        except CannotListen as exc:
            log.error("%s", exc)
            return 2
        return 0
    # Unix sockets cannot be shared with SO_REUSEPORT: bind once here, workers inherit the fd.
    every = [*settings.listeners, settings.admin.listener]
    try:
        unix_socks = {
            lst.unix: bind_unix(lst.unix, lst.name) for lst in every if lst is not None and lst.unix
        }
    except CannotListen as exc:
        log.error("%s", exc)
        return 2
    children: list[int] = []
    # each worker's own /metrics socket, for its siblings (private: mkdtemp makes it 0700)
    sockets = tempfile.mkdtemp(prefix="latentgate-workers-")
    parent = os.getpid()
    for index in range(workers):
        pid = fork()  # (a stop sent to a worker not yet running is kept)
        if pid == 0:
            _end_with_parent(parent)
            code = 0
            try:
                with asyncio.Runner(loop_factory=_new_loop) as runner:
                    runner.run(
                        serve(
                            settings,
                            unix_socks,
                            reuse_port=True,
                            config_path=config_path,
                            early=early,
                            workers=Workers(index, workers, sockets),
                        )
                    )
            except CannotListen as exc:
                log.error("%s", exc)
                code = 2
            except BaseException:
                log.exception("worker failed")
                code = 1
            os._exit(code)
        children.append(pid)
    log.info("started %d workers: %s", workers, children)
    alive = set(children)
    stopping: list[int] = []  # the stop forwarded, repeated until every worker has ended

    def forward(signum: int, _frame: object) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT) and not stopping:
            stopping.append(signum)
            # A safety net: a stop lost on its way into a worker leaves it serving, and the
            # server never ends (`systemctl stop` waits for its SIGKILL). The cause found, a worker
            # not yet run when the stop came, is closed (early_signals.fork). Repeated each
            # second as STOP_REPEAT, a stop is acted on once the worker's handlers are in; a
            # worker draining already, or not yet able to act, ignores it.
            signal.setitimer(signal.ITIMER_REAL, _STOP_REPEAT_S, _STOP_REPEAT_S)
        for child in list(alive):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signum)

    signal.signal(signal.SIGALRM, lambda _s, _f: forward(STOP_REPEAT, None))
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGHUP, forward)  # each worker reloads its own copy
    signal.signal(signal.SIGUSR1, forward)  # a purge one worker took: the others drop memory
    for signum in sorted(set(early)):  # what came while the workers were being forked
        forward(signum, None)
    early.clear()
    failed = 0
    for ended in range(1, len(children) + 1):  # as they end: a death is said when it happens
        pid, status = os.wait()
        alive.discard(pid)  # (its pid may be another process's from now on)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            failed += 1
            how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            log.error("worker %d ended (%s); %d still serving", pid, how, len(children) - ended)
    signal.setitimer(signal.ITIMER_REAL, 0)
    shutil.rmtree(sockets, ignore_errors=True)
    sys.stdout.flush()
    # non-zero when any worker did not end cleanly: a supervisor's Restart=on-failure acts
    return 1 if failed else 0
