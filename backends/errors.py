"""BackendError tree. Everything above backends/ sees only these, never aiohttp's exceptions.

BackendError
├── UpstreamError                      a remote replica failed us
│   ├── UpstreamConnectError (ConnectionError)   nothing reached the replica: safe to retry
│   ├── UpstreamTimeout (TimeoutError)           connect, first byte or total deadline passed
│   ├── UpstreamProtocolError                    the replica broke HTTP or the stream mid-way
│   └── AnswerTooLarge                           it answered, over the cap its reader holds
├── Overloaded                         circuit breaker / admission refused (fast 503)
└── EngineError                        a local engine failed
    ├── BadInput (ValueError)          the request does not fit the model: a 400
    ├── ModelNotFound (LookupError)    no such model or endpoint on a local engine: a 404
    └── LoadStopped                    the process stopped while the model was being built
"""

from __future__ import annotations


class BackendError(Exception):
    pass


class UpstreamError(BackendError):
    def __init__(
        self, message: str, replica: str | None = None, pushback_ms: str | None = None
    ) -> None:
        super().__init__(message)
        self.replica = replica
        # a gRPC replica's grpc-retry-pushback-ms with the failure (gRFC A6), as sent
        self.pushback_ms = pushback_ms


class UpstreamConnectError(UpstreamError, ConnectionError):
    pass


class UpstreamTimeout(UpstreamError, TimeoutError):
    pass


class UpstreamProtocolError(UpstreamError):
    pass


class AnswerTooLarge(UpstreamError):
    """The replica answered with more than the gateway holds of one answer (a gRPC replica's
    reply over limits.max_body_bytes): refused, never buffered whole nor stored. It answered,
    so this says nothing of its health, and another replica would send the same: it is
    neither retried nor counted against the replica."""

    def __init__(self, replica: str, limit: int) -> None:
        super().__init__(f"{replica} sent an answer over {limit} bytes", replica)
        self.limit = limit


class RequestBodyError(Exception):
    """The client's request body failed while it was being forwarded (over the size limit, cut
    off, undecodable): the request's fault, not the replica's, so it is neither retried nor
    counted against the replica. `answer` is the error the client gets."""

    def __init__(self, answer: Exception) -> None:
        super().__init__(str(answer))
        self.answer = answer


class Overloaded(BackendError):
    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EngineError(BackendError):
    pass


class BadInput(EngineError, ValueError):
    pass


class ModelNotFound(EngineError, LookupError):
    pass


class LoadStopped(EngineError):
    pass
