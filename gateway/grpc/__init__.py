"""Open Inference Protocol v2 over gRPC (`inference.GRPCInferenceService`): the gRPC listener.

server.py runs the grpc.aio server, service.py the RPCs, infer.py ModelInfer with the exact
cache, codec.py the message ↔ tensor / HTTP v2 conversions, status.py the status codes.
This package's root imports no grpc: an app without a gRPC listener never loads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from gateway.grpc.server import GrpcListeners

GRPC: web.AppKey[GrpcListeners] = web.AppKey("latentgate_grpc")
