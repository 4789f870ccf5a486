"""A streamed upstream body that runs the pool's end-of-call accounting when it ends."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable


class TrackedBody:
    """Wraps a streamed body so the pool's accounting ends when the stream does (or is closed)."""

    def __init__(self, inner: AsyncIterator[bytes], on_end: list[Callable[[], None]]) -> None:
        self._inner = inner
        self._on_end = on_end
        self._closed = False

    def __aiter__(self) -> TrackedBody:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._inner.__anext__()
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._inner.aclose()  # type: ignore[attr-defined]
        finally:
            for cb in self._on_end:
                cb()
