"""`protocol: grpc` routes belong to the gRPC listener; an HTTP request that reaches one gets a
404 saying where the route is served, never a pass-through to a gRPC backend."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.errors import NotFound
from gateway.protocols.base import Call


class GrpcRouteAdapter:
    name = "grpc"
    keyed_headers: tuple[str, ...] = ()

    def parse(
        self,
        method: str,
        path: str,
        query: str,
        content_type: str,
        body: bytes,
        headers: Mapping[str, str] | None = None,
    ) -> Call | None:
        raise NotFound(f"{path} is a gRPC route: call it on the gRPC listener")
