"""Fixtures for the gRPC listener: a gRPC v2 test upstream and gateways serving gRPC."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from gateway.grpc import GRPC
from tests.support.grpc_upstream import GrpcUpstreamThread
from tests.support.servers import ServerThread

GRPC_PREFIX = "/inference.GRPCInferenceService/"


def grpc_config(replicas: list[str], **extra: Any) -> dict[str, Any]:
    """An HTTP and a gRPC listener (ports chosen by the OS); gRPC model calls to a gRPC pool."""
    pool: dict[str, Any] = {
        "kind": "remote",
        "replicas": replicas,
        "timeouts": {"connect": 1, "read": 5, "total": 10},
    }
    pool.update(extra.pop("pool", {}))
    cfg: dict[str, Any] = {
        "listeners": [
            {"name": "main", "host": "127.0.0.1", "port": 0},
            {"name": "grpc", "protocol": "grpc", "host": "127.0.0.1", "port": 0},
        ],
        "backends": {"grpc-up": pool},
        "routes": [
            {
                "name": "grpc-v2",
                "match": {"prefix": GRPC_PREFIX},
                "protocol": "grpc",
                "backend": "grpc-up",
                "cache": {"exact": {"enabled": True, "tiers": ["memory"]}},
                **extra.pop("route", {}),
            }
        ],
    }
    cfg.update(extra)
    return cfg


def grpc_port(gw: ServerThread) -> int:
    assert gw.app is not None
    return gw.app[GRPC].ports["grpc"]


def client(gw: ServerThread) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port(gw)}")


@pytest.fixture
def grpc_upstream() -> Iterator[GrpcUpstreamThread]:
    server = GrpcUpstreamThread("u1").start()
    yield server
    server.stop()


@pytest.fixture
def grpc_gateway(
    grpc_upstream: GrpcUpstreamThread, start_gateway: Callable[..., ServerThread]
) -> ServerThread:
    return start_gateway(grpc_config([f"grpc://{grpc_upstream.target}"]))
