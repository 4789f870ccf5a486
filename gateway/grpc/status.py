"""Errors on the gRPC edge: every failure becomes one status code with a message.

BackendError and GatewayError are translated here, as the HTTP pipeline translates them to
status codes; an upstream gRPC replica's own non-OK status is passed on as it was.
"""

from __future__ import annotations

import json

import grpc

from backends import (
    GRPC_MESSAGE_HEADER,
    GRPC_STATUS_HEADER,
    AnswerTooLarge,
    BackendError,
    BadInput,
    BodyTooLarge,
    ModelNotFound,
    Overloaded,
    UpstreamError,
    UpstreamResponse,
    UpstreamTimeout,
)
from gateway.errors import GatewayError

_CODE_OF_HTTP = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    501: grpc.StatusCode.UNIMPLEMENTED,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
_CODE_OF_NUMBER = {c.value[0]: c for c in grpc.StatusCode}


class RpcError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def code_of_http(status: int) -> grpc.StatusCode:
    return _CODE_OF_HTTP.get(status, grpc.StatusCode.INTERNAL)


def from_gateway(err: GatewayError) -> RpcError:
    return RpcError(code_of_http(err.status), err.message)


def from_backend(err: BackendError, backend: str) -> RpcError:
    if isinstance(err, BadInput):
        return RpcError(grpc.StatusCode.INVALID_ARGUMENT, str(err))
    if isinstance(err, ModelNotFound):
        return RpcError(grpc.StatusCode.NOT_FOUND, str(err))
    if isinstance(err, Overloaded):
        return RpcError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{err} (retry after {err.retry_after_s:.0f}s)",
        )
    if isinstance(err, AnswerTooLarge):  # a gRPC replica's reply: as read_answer says it
        return _over_cap(backend, err.limit)
    if isinstance(err, UpstreamTimeout):
        return RpcError(grpc.StatusCode.DEADLINE_EXCEEDED, f"upstream {backend} timed out: {err}")
    if isinstance(err, UpstreamError):
        return RpcError(grpc.StatusCode.UNAVAILABLE, f"upstream {backend} failed: {err}")
    return RpcError(grpc.StatusCode.INTERNAL, f"backend {backend} failed: {err}")


def from_response(resp: UpstreamResponse, body: bytes) -> RpcError:
    """A non-OK answer: a gRPC replica's own status, or an HTTP v2 backend's status + message."""
    number = resp.header(GRPC_STATUS_HEADER)
    if number is not None and number.isdigit():
        code = _CODE_OF_NUMBER.get(int(number), grpc.StatusCode.UNKNOWN)
        return RpcError(code, resp.header(GRPC_MESSAGE_HEADER) or code.name)
    message = body.decode("utf-8", "replace")[:1000]
    try:
        doc = json.loads(body)
        err = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(err, dict):
            err = err.get("message")
        if isinstance(err, str):
            message = err
    except ValueError:
        pass
    return RpcError(code_of_http(resp.status), message or f"backend answered {resp.status}")


async def read_answer(resp: UpstreamResponse, backend: str, limit: int) -> bytes:
    """An HTTP answer the gRPC edge needs whole (to convert it to one reply), held to `limit`
    (limits.max_body_bytes, the largest message the listener takes): a replica sending an
    endless or huge body is cut off there, the connection closed, never buffered whole. Over
    HTTP the answer would stream through; one gRPC reply cannot, so it is RESOURCE_EXHAUSTED."""
    try:
        return await resp.read_capped(limit)
    except BodyTooLarge:
        raise _over_cap(backend, limit) from None


def _over_cap(backend: str, limit: int) -> RpcError:
    return RpcError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"upstream {backend} sent an answer over {limit} bytes (limits.max_body_bytes)",
    )
