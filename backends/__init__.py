"""Backends: remote replica pools and local engines. Never imports cache or gateway."""

from backends.base import Backend, UpstreamRequest, UpstreamResponse
from backends.errors import (
    BackendError,
    BadInput,
    EngineError,
    ModelNotFound,
    Overloaded,
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeout,
)
from backends.factory import build_backends, preflight

__all__ = [
    "Backend",
    "BackendError",
    "BadInput",
    "EngineError",
    "ModelNotFound",
    "Overloaded",
    "UpstreamConnectError",
    "UpstreamError",
    "UpstreamProtocolError",
    "UpstreamRequest",
    "UpstreamResponse",
    "UpstreamTimeout",
    "build_backends",
    "preflight",
]
