"""One inference session per model file and settings, per app.

The default config serves all-MiniLM-L6-v2 twice: as the local `/v1/embeddings` backend and as
the semantic cache's embedder. Without sharing, that is two ONNX Runtime sessions of the same
weights (memory twice, warm-up twice). `EngineShare.acquire` hands out one engine per key with a
reference count; each holder's `close()` releases its reference and the last one closes the
session. ORT sessions are thread-safe, so the holders' batchers may run it concurrently.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from typing import Any

from numpy.typing import NDArray

from backends.local.engine import Engine, TensorSpec

log = logging.getLogger("latentgate.local")


class SharedEngine:
    """An Engine whose close() releases one reference to the session behind it."""

    def __init__(self, inner: Engine, release: Callable[[], None]) -> None:
        self.inner = inner
        self.name: str = inner.name
        self.device: str = inner.device
        self.providers: list[str] = inner.providers
        self.inputs: list[TensorSpec] = inner.inputs
        self.outputs: list[TensorSpec] = inner.outputs
        self.batch_invariant: bool = inner.batch_invariant
        self._release: Callable[[], None] | None = release

    def run(self, feeds: dict[str, NDArray[Any]]) -> dict[str, NDArray[Any]]:
        return self.inner.run(feeds)

    def close(self) -> None:
        release, self._release = self._release, None
        if release is not None:  # idempotent: a holder closing twice releases once
            release()


class EngineShare:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._engines: dict[Hashable, tuple[Engine, int]] = {}

    def acquire(self, key: Hashable, build: Callable[[], Engine]) -> SharedEngine:
        with self._lock:
            held = self._engines.get(key)
            if held is None:
                engine = build()
                self._engines[key] = (engine, 1)
            else:
                engine, refs = held
                self._engines[key] = (engine, refs + 1)
                log.info(
                    "engine %s: sharing the loaded session (%d holders)", engine.name, refs + 1
                )
        return SharedEngine(engine, lambda: self._release(key))

    def _release(self, key: Hashable) -> None:
        with self._lock:
            engine, refs = self._engines[key]
            if refs > 1:
                self._engines[key] = (engine, refs - 1)
                return
            del self._engines[key]
        engine.close()

    def __len__(self) -> int:
        return len(self._engines)
