"""HTTP/1.1 transport: one aiohttp ClientSession per replica over a TCP or unix-socket connector.

Keep-alive connections are pooled by the connector; nothing here opens a connection per request.
aiohttp's exceptions are mapped to the BackendError tree at this boundary (`map_errors`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from yarl import URL

from backends.base import UpstreamRequest, UpstreamResponse
from backends.errors import (
    RequestBodyError,
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeout,
)
from backends.remote.transports.response_head import response_head
from backends.settings import PoolLimits, Timeouts

# Bodies up to this size with a Content-Length are read whole: one write downstream, no chunking.
BUFFER_LIMIT = 1 << 20
_SKIP_AUTO = frozenset({"User-Agent", "Accept-Encoding", "Content-Type", "Accept"})
DEADLINE_HEADER = "X-Latentgate-Deadline-Ms"
_DEADLINE_SLACK_S = 0.05


def with_deadline(
    request: UpstreamRequest, deadline_s: float | None, total_s: float
) -> tuple[list[tuple[str, str]], float | None]:
    """The request's headers, announcing its deadline upstream when it has one, and that
    deadline when it is tighter than the transport's total timeout (None: the total bounds it).
    Both HTTP/1.1 transports use this, so they send and enforce the same deadline."""
    headers = request.headers
    deadline = deadline_s if deadline_s is not None else request.deadline_s
    if deadline is None:
        return headers, None
    # the gateway's deadline replaces one a client sent: an upstream reading the first value
    # (aiohttp's, Starlette's headers.get) would otherwise take the client's, however loose
    low = DEADLINE_HEADER.lower()
    headers = [h for h in headers if h[0].lower() != low]
    headers.append((DEADLINE_HEADER, str(max(0, int(deadline * 1000)))))
    return headers, deadline if deadline < total_s - _DEADLINE_SLACK_S else None


def read_whole(length: int | None, content_type: str) -> bool:
    """Whether a response body is read whole (else streamed): a known, small length, and not
    an event stream."""
    return length is not None and length <= BUFFER_LIMIT and "text/event-stream" not in content_type


# What the hot path catches; `translate` turns each into the BackendError tree.
_MAPPED = (aiohttp.ClientError, TimeoutError)


async def _watched(
    body: AsyncIterator[bytes], failed: list[RequestBodyError]
) -> AsyncIterator[bytes]:
    """The request body, noting a failure of the client's side (aiohttp's writer turns it into
    a connection error of its own)."""
    try:
        async for chunk in body:
            yield chunk
    except RequestBodyError as exc:
        failed.append(exc)
        raise


def translate(exc: BaseException, replica: str, phase: str) -> UpstreamError:
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ClientConnectionResetError):
        return UpstreamConnectError(f"cannot connect to {replica}: {exc}", replica)
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return UpstreamTimeout(f"{replica} timed out during {phase}", replica)
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return UpstreamProtocolError(f"{replica} closed the connection during {phase}", replica)
    if isinstance(exc, aiohttp.ClientPayloadError):
        return UpstreamProtocolError(f"{replica} sent a broken body during {phase}: {exc}", replica)
    return UpstreamProtocolError(f"{replica} failed during {phase}: {exc}", replica)


@contextmanager
def map_errors(replica: str, phase: str) -> Iterator[None]:
    try:
        yield
    except _MAPPED as exc:
        raise translate(exc, replica, phase) from exc


class _Body:
    """A streamed response body. Closing it early (or never reading it) closes the connection
    instead of returning it to the pool dirty; a body read to the end releases it for reuse."""

    def __init__(self, resp: aiohttp.ClientResponse, replica: str) -> None:
        self._resp = resp
        self._replica = replica
        self._it = resp.content.iter_any().__aiter__()

    def __aiter__(self) -> _Body:
        return self

    async def __anext__(self) -> bytes:
        try:
            with map_errors(self._replica, "stream"):
                return await self._it.__anext__()
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        if self._resp.content.at_eof():
            self._resp.release()
        else:
            self._resp.close()


class _InStep:
    """aiohttp's connector hands out an idle connection that has since received bytes nobody
    asked for (a replica that answered twice): the next request, another client's, would read
    that stray response as its own (aio-libs/aiohttp#13656). Such a connection says so
    (`should_close`: bytes buffered) and is closed here instead of reused. `_get` is aiohttp's
    own pool lookup; tests/unit/backends/test_http1_transports.py fails should it change."""

    async def _get(self, key: Any, traces: Any) -> Any:
        while (conn := await super()._get(key, traces)) is not None:  # type: ignore[misc]
            proto = conn.protocol
            if proto is None or not proto.should_close:
                return conn
            conn.close()
        return None


class _TCPConnector(_InStep, aiohttp.TCPConnector):
    pass


class _UnixConnector(_InStep, aiohttp.UnixConnector):
    pass


class Http1Transport:
    """Pooled HTTP/1.1 to one replica: `http(s)://host:port` or `unix:/path/to.sock`."""

    def __init__(self, url: str, limits: PoolLimits, timeouts: Timeouts) -> None:
        self.url = url
        self._timeouts = timeouts
        if url.startswith("unix:"):
            self._base = "http://localhost"
            connector: aiohttp.BaseConnector = _UnixConnector(
                path=url[len("unix:") :],
                limit=limits.max_connections,
                keepalive_timeout=limits.keepalive_s,
            )
        else:
            parts = urlsplit(url)
            self._base = f"{parts.scheme}://{parts.netloc}"
            connector = _TCPConnector(
                limit=limits.max_connections,
                limit_per_host=0,
                keepalive_timeout=limits.keepalive_s,
                ttl_dns_cache=60,
            )
        self._connector = connector
        self._session = aiohttp.ClientSession(
            connector=connector,
            # One session serves every downstream client: a cookie jar would hand one user's
            # upstream cookies to the next. Cookies pass through as plain headers instead.
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            skip_auto_headers=_SKIP_AUTO,
            timeout=aiohttp.ClientTimeout(
                total=timeouts.total, sock_connect=timeouts.connect, sock_read=timeouts.read
            ),
        )

    async def send(
        self,
        request: UpstreamRequest,
        *,
        connect_s: float | None = None,
        deadline_s: float | None = None,
    ) -> UpstreamResponse:
        # The session's own total timeout already bounds a deadline within _DEADLINE_SLACK_S
        # of it; building a ClientTimeout per request is only worth it for a tighter one.
        headers, short = with_deadline(request, deadline_s, self._timeouts.total)
        timeout = None
        if short is not None or (connect_s is not None and connect_s != self._timeouts.connect):
            timeout = aiohttp.ClientTimeout(
                total=short if short is not None else self._timeouts.total,
                sock_connect=connect_s if connect_s is not None else self._timeouts.connect,
                sock_read=self._timeouts.read,
            )
        body = request.body
        failed: list[RequestBodyError] = []
        if body is not None and not isinstance(body, bytes):
            body = _watched(body, failed)
        try:
            resp = await self._session.request(
                request.method,
                # The client's path and query go upstream byte for byte: no re-quoting.
                URL(self._base + request.path_qs, encoded=True),
                headers=headers,
                data=body,
                allow_redirects=False,
                timeout=timeout if timeout is not None else aiohttp.helpers.sentinel,
            )
        except RequestBodyError:
            raise
        except _MAPPED as exc:
            if failed:  # aiohttp wraps what the body raised: it was the client's, say so
                raise failed[0] from exc
            raise translate(exc, self.url, "request") from exc
        try:
            # (aiohttp's reason is text already: its bytes again, as the lean transport has them)
            reason = (resp.reason or "").encode("utf-8", "surrogateescape")
            text, fields = response_head(self.url, reason, resp.raw_headers)
        except BaseException:
            resp.close()  # never back to the pool with its body unread
            raise
        out = UpstreamResponse(resp.status, text, fields, replica=self.url)
        length = resp.content_length
        ctype = resp.headers.get("Content-Type", "")
        if read_whole(length, ctype):
            try:
                out.body = await resp.read()
            except BaseException as exc:
                resp.close()  # cancelled or broken mid-body: never back to the pool dirty
                if isinstance(exc, _MAPPED):
                    raise translate(exc, self.url, "body") from exc
                raise
            resp.release()
        else:
            out.stream = _Body(resp, self.url)
        return out

    def connections_in_use(self) -> int:
        # Checked by the breaker on every request: no dict building here.
        return len(getattr(self._connector, "_acquired", ()))

    def pool_stats(self) -> dict[str, int]:
        conns = getattr(self._connector, "_conns", {})
        acquired = getattr(self._connector, "_acquired", ())
        return {
            "idle": sum(len(v) for v in conns.values()),
            "in_use": len(acquired),
            "limit": self._connector.limit,
        }

    @property
    def closed(self) -> bool:
        return self._session.closed

    async def aclose(self) -> None:
        await self._session.close()
        # Let the connector's transports finish closing before the loop moves on.
        await asyncio.sleep(0)
