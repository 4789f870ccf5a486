"""Real servers for tests: aiohttp apps in a background thread, subprocesses, a real Redis."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def self_connected(sock: socket.socket) -> bool:
    """Nothing listens yet, but the kernel gave the client the very port it dials: TCP connects
    to itself. free_port() ports are ephemeral ones, so this happens now and then, and taking it
    for "open" starts a test before its server listens (its first requests are refused)."""
    return bool(sock.getsockname() == sock.getpeername())


def wait_port(host: str, port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.2) as sock:
                if not self_connected(sock):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{host}:{port} did not open within {timeout}s")


def wait_semantic(url: str, timeout: float = 180.0) -> None:
    """The semantic stage loads in the background after the listeners open: wait until /readyz
    says it is in (or failed; or the gateway has none), as a client that checks readiness would."""
    import json
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=5) as resp:
                doc = json.loads(resp.read())
        except urllib.error.HTTPError as err:
            doc = json.loads(err.read())
        semantic = doc.get("semantic")
        if semantic is None or semantic["ready"] or semantic["error"]:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the semantic stage did not load in {timeout}s: {semantic}")
        time.sleep(0.05)


class ServerThread:
    """Runs an aiohttp app on its own event loop in a daemon thread, on TCP and/or a unix socket."""

    def __init__(
        self,
        factory: Callable[[], web.Application],
        *,
        uds: str | None = None,
        tcp: bool = True,
        runner_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self._factory = factory
        self._uds = uds
        self._tcp = tcp
        self._runner_kwargs = runner_kwargs or {}
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self.app: web.Application | None = None
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServerThread:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(60)
        if self.port and self._loads_semantic():
            wait_semantic(self.url)  # as before the stage loaded in the background
        return self

    def _loads_semantic(self) -> bool:
        from gateway.state import STATE

        state = self.app.get(STATE) if self.app is not None else None
        return state is not None and state.semantic is not None

    async def _start(self) -> None:
        self.app = self._factory()
        self._runner = web.AppRunner(self.app, access_log=None, **self._runner_kwargs)
        await self._runner.setup()
        if self._tcp:
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            server = site._server
            assert server is not None
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        if self._uds:
            await web.UnixSite(self._runner, self._uds).start()

    def call(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if self._runner is not None:
            # a server that failed half-way still has to let the test finish
            with contextlib.suppress(Exception):
                self.call(self._runner.cleanup(), 30)
        with contextlib.suppress(Exception):
            self.call(self._cancel_leftovers(), 10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()  # an unclosed loop is a ResourceWarning (and its selector's fd)

    @staticmethod
    async def _cancel_leftovers() -> None:
        """Tasks the app left behind (a background load still running) and async generators."""
        me = asyncio.current_task()
        left = [t for t in asyncio.all_tasks() if t is not me]
        for t in left:
            t.cancel()
        await asyncio.gather(*left, return_exceptions=True)
        await asyncio.get_running_loop().shutdown_asyncgens()


class RedisServer:
    """A real redis-server process on a free port, persistence off; `extra` adds arguments
    (cluster mode, replicaof: see tests/support/redis_topologies.py)."""

    def __init__(self, extra: list[str] | None = None) -> None:
        exe = os.environ.get("LATENTGATE_REDIS_SERVER") or shutil.which("redis-server")
        if exe is None:
            raise RuntimeError(
                "redis-server not found: `make test` installs it (Debian's redis-server)"
            )
        self.exe = exe
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="lg-redis-")
        self.extra = extra or []
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.proc = subprocess.Popen(
            [
                self.exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
                "--protected-mode",
                "no",
                # the fault tests stall the server with DEBUG SLEEP (refused by default since 7.0)
                "--enable-debug-command",
                "local",
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port("127.0.0.1", self.port)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class GatewayProcess:
    """`python -m gateway serve` as a real process, from a config dict written to a temp file."""

    def __init__(
        self,
        config: dict[str, Any],
        *,
        workers: int = 1,
        env: dict[str, str] | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        self.port = free_port()
        cfg = dict(config)
        # The main TCP listener is this object's; unix sockets and gRPC listeners are kept.
        listeners = [
            x for x in cfg.get("listeners", []) if "unix" in x or x.get("protocol") == "grpc"
        ]
        cfg["listeners"] = [{"name": "main", "host": "127.0.0.1", "port": self.port}, *listeners]
        fd, self.config_path = tempfile.mkstemp(suffix=".yaml", prefix="lg-")
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(cfg, f)
        self.workers = workers
        self.extra_args = extra_args or []
        self.env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.config_path + ".log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, semantic_ready: bool = True) -> GatewayProcess:
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop(), it outlives start()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway",
                "serve",
                "--config",
                self.config_path,
                "--workers",
                str(self.workers),
                *self.extra_args,
            ],
            cwd=ROOT,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_port("127.0.0.1", self.port, 60)
            # with --workers N the port answers once the first worker listens; tests that
            # spread connections over the workers need every one of them
            deadline = time.monotonic() + 60
            main = f"listening on http://127.0.0.1:{self.port} ("
            while self.log().count(main) < self.workers:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise TimeoutError
                time.sleep(0.05)
        except TimeoutError:
            self.stop()
            raise RuntimeError("gateway did not start:\n" + self.log()) from None
        if semantic_ready:
            wait_semantic(self.url)
        return self

    def log(self) -> str:
        return Path(self.log_path).read_text(errors="replace")

    def stop(self, sig: int | None = None, timeout: float = 30) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig or 15)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        return self.proc.returncode


def one_route(path: str, handler: Any, method: str = "POST") -> Callable[[], web.Application]:
    """An app answering `method path` with `handler` alone: a stand-in upstream that speaks
    exactly as one real server does (pass it to `running` or ServerThread)."""

    def app() -> web.Application:
        a = web.Application()
        a.router.add_route(method, path, handler)
        return a

    return app


@contextlib.contextmanager
def running(app: Callable[[], web.Application]) -> Iterator[ServerThread]:
    """A started ServerThread of `app`, stopped when the block ends (a fixture yields it)."""
    server = ServerThread(app).start()
    try:
        yield server
    finally:
        server.stop()
