"""The gRPC listener: a grpc.aio server on every `protocol: grpc` listener, living with the app.

It starts after the backends (the app's cleanup_ctx enters in order) and stops before they
close. `drain(grace)` (SIGTERM in gateway/server.py, then the app's cleanup) refuses new calls
at once and lets in-flight ones finish within the grace period.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc
import grpc.aio
from aiohttp import web

from gateway.config import LimitSettings, ListenerSettings
from gateway.grpc import GRPC
from gateway.grpc.service import InferenceService
from gateway.state import AppState

log = logging.getLogger("latentgate.grpc")


def address_of(listener: ListenerSettings) -> str:
    if listener.unix is not None:
        return f"unix:{listener.unix}"
    return f"{listener.host or '127.0.0.1'}:{listener.port or 0}"


class GrpcListeners:
    def __init__(
        self, state: AppState, listeners: list[ListenerSettings], limits: LimitSettings
    ) -> None:
        self.service = InferenceService(state)
        self.listeners = listeners
        self.limits = limits
        # gateway/server.py sets this with --workers: every worker binds the same port.
        self.reuse_port = False
        self.ports: dict[str, int] = {}  # listener name → bound TCP port (0 for unix sockets)
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", self.limits.max_body_bytes),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 1 if self.reuse_port else 0),
                ("grpc.max_connection_idle_ms", int(self.limits.client_idle_timeout_s * 1000)),
            ]
        )
        server.add_generic_rpc_handlers((self.service.handler(),))
        for lst in self.listeners:
            address = address_of(lst)
            try:
                port = server.add_insecure_port(address)
            except RuntimeError as exc:  # grpcio says "Failed to bind" this way too
                raise OSError(f"gRPC listener {lst.name!r} could not bind {address}") from exc
            if lst.unix is None and port == 0:
                raise OSError(f"gRPC listener {lst.name!r} could not bind {address}")
            self.ports[lst.name] = port
        await server.start()
        self._server = server
        for lst in self.listeners:
            bound = lst.unix or f"{lst.host or '127.0.0.1'}:{self.ports[lst.name]}"
            log.info("gRPC (Open Inference v2) listening on %s", bound)

    async def drain(self, grace_s: float) -> None:
        """No new calls; in-flight ones get up to grace_s, then are cancelled."""
        server, self._server = self._server, None
        if server is not None:
            log.info("gRPC draining: %d calls in flight", self.service.in_flight)
            await server.stop(grace_s)

    async def lifecycle(self, _: web.Application) -> AsyncIterator[None]:
        await self.start()
        yield
        await self.drain(self.limits.shutdown_grace_s)


def install(app: web.Application, state: AppState) -> None:
    """Serve the config's gRPC listeners with this app (nothing when there are none)."""
    listeners = [lst for lst in state.settings.listeners if lst.protocol == "grpc"]
    if not listeners:
        return
    grpc_listeners = GrpcListeners(state, listeners, state.settings.limits)
    app[GRPC] = grpc_listeners
    app.cleanup_ctx.append(grpc_listeners.lifecycle)
