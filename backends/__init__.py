"""Backends: remote replica pools and local engines. Never imports cache or gateway."""

from backends import v2tensors
from backends.base import (
    GRPC_MESSAGE_HEADER,
    GRPC_STATUS_HEADER,
    Backend,
    BodyTooLarge,
    UpstreamRequest,
    UpstreamResponse,
)
from backends.bodies import MSGPACK_TYPES, unpack_msgpack
from backends.errors import (
    AnswerTooLarge,
    BackendError,
    BadInput,
    EngineError,
    ModelNotFound,
    Overloaded,
    RequestBodyError,
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeout,
)
from backends.factory import build_backends, preflight
from backends.preprocess.unknown import UnknownSpans
from backends.remote.metrics import RemoteMetrics
from backends.settings import BackendSettings, BatcherSettings, RoutePolicy, SessionOptions

__all__ = [
    "GRPC_MESSAGE_HEADER",
    "GRPC_STATUS_HEADER",
    "MSGPACK_TYPES",
    "AnswerTooLarge",
    "Backend",
    "BackendError",
    "BackendSettings",
    "BadInput",
    "BatcherSettings",
    "BodyTooLarge",
    "EngineError",
    "ModelNotFound",
    "Overloaded",
    "RemoteMetrics",
    "RequestBodyError",
    "RoutePolicy",
    "SessionOptions",
    "UnknownSpans",
    "UpstreamConnectError",
    "UpstreamError",
    "UpstreamProtocolError",
    "UpstreamRequest",
    "UpstreamResponse",
    "UpstreamTimeout",
    "build_backends",
    "preflight",
    "unpack_msgpack",
    "v2tensors",
]
