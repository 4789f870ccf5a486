"""The Open Inference v2 gRPC messages (`inference.GRPCInferenceService`).

They are Triton's own generated modules, shipped by tritonclient[grpc]: the same descriptors
the clients load, so a process holding both a client and this server registers each message
once (a second copy generated here from KServe's proto would collide in protobuf's pool).
"""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as config_pb2
from tritonclient.grpc import service_pb2 as pb2

SERVICE = "inference.GRPCInferenceService"
PREFIX = f"/{SERVICE}/"

__all__ = ["PREFIX", "SERVICE", "config_pb2", "pb2"]
