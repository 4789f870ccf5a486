"""GatewayError tree and how each becomes an HTTP status with the route's protocol envelope."""

from __future__ import annotations

import json

from cache import CallerGone


class GatewayError(Exception):
    status = 500
    error_type = "internal_error"

    def __init__(
        self, message: str, *, param: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = headers or {}


class BadRequest(GatewayError):
    status = 400
    error_type = "invalid_request_error"


class NotFound(GatewayError):
    status = 404
    error_type = "not_found"


class MethodNotAllowed(GatewayError):
    status = 405
    error_type = "method_not_allowed"


class RequestTimeout(GatewayError):
    status = 408
    error_type = "request_timeout"


class PayloadTooLarge(GatewayError):
    status = 413
    error_type = "payload_too_large"


class ExpectationFailed(GatewayError):
    """An `Expect` other than 100-continue (RFC 9110 10.1.1)."""

    status = 417
    error_type = "expectation_failed"


class UnsupportedMediaType(GatewayError):
    status = 415
    error_type = "unsupported_media_type"


class NotImplementedCoding(GatewayError):
    """A request transfer coding the server does not implement (RFC 9112 6.1: 501)."""

    status = 501
    error_type = "not_implemented"


class Unauthorized(GatewayError):
    status = 401
    error_type = "unauthorized"


class BadGateway(GatewayError):
    status = 502
    error_type = "upstream_error"


class ServiceUnavailable(GatewayError):
    status = 503
    error_type = "unavailable"


class GatewayTimeout(GatewayError):
    status = 504
    error_type = "upstream_timeout"


class ClientClosed(GatewayError, CallerGone):
    """The client hung up before its answer (nginx's 499): the access log says so; nobody reads
    the body."""

    status = 499
    error_type = "client_closed_request"


class NotInCache(GatewayError):
    """Cache-Control: only-if-cached, and nothing stored to answer with (RFC 9111 5.2.1.7).

    The openai and anthropic SDKs retry a 504 (twice by default, with backoff) unless told
    not to: asking again finds the same nothing, so the answer says `x-should-retry: false`."""

    status = 504
    error_type = "not_cached"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"x-should-retry": "false"})


# The Messages API's error types by status (https://docs.anthropic.com/en/api/errors).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "request_too_large",
    415: "invalid_request_error",
    417: "invalid_request_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def error_body(protocol: str, err: GatewayError) -> bytes:
    """The error envelope clients of each protocol already parse."""
    if protocol == "v2":
        return json.dumps({"error": err.message}).encode()
    if protocol == "anthropic":
        kind = _ANTHROPIC_TYPES.get(err.status, "api_error")
        return json.dumps(
            {"type": "error", "error": {"type": kind, "message": err.message}}
        ).encode()
    payload: dict[str, object] = {
        "message": err.message,
        "type": err.error_type,
        "param": err.param,
        "code": err.status,
    }
    return json.dumps({"error": payload}).encode()


def stream_error_event(protocol: str, message: str) -> bytes | None:
    """The event that ends a stream cut after its headers went out, as the route's SDKs read
    one (the OpenAI SDK raises on a `data:` object with an `error`, Anthropic's on an `error`
    event). A close alone looks, to an HTTP/1.0 client (no chunked framing), like the end of
    a whole answer. The blank lines first end an event the cut left half sent. None where the
    gateway does not know the stream's framing (passthrough)."""
    if protocol not in ("openai", "anthropic"):
        return None
    head = b"event: error\n" if protocol == "anthropic" else b""
    return b"\n\n" + head + b"data: " + error_body(protocol, BadGateway(message)) + b"\n\n"
