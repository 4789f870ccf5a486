"""Which transport a replica URL gets."""

from __future__ import annotations

from backends.remote.transports.base import Transport
from backends.remote.transports.http1 import Http1Transport
from backends.remote.transports.lean_http1 import LeanHttp1Transport
from backends.settings import ANSWER_CAP, RemoteBackendSettings, wire_of


def make_transport(
    url: str, settings: RemoteBackendSettings, answer_cap: int = ANSWER_CAP
) -> Transport:
    """The replica URL's scheme picks the wire: grpc:// and grpc+unix: speak gRPC.
    `answer_cap`: the largest reply a gRPC replica may send (HTTP answers stream through)."""
    if wire_of(url) == "grpc":
        from backends.remote.transports.grpc import GrpcTransport  # grpc loads only when used

        return GrpcTransport(url, settings.pool, settings.timeouts, answer_cap)
    if settings.pool.http_client == "lean" and not url.startswith("https:"):
        return LeanHttp1Transport(url, settings.pool, settings.timeouts)
    return Http1Transport(url, settings.pool, settings.timeouts)
