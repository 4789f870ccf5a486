"""Sentence embeddings on a local engine: tokenize → batch → ONNX Runtime/TensorRT → pool → L2.

The semantic cache's embedder and the `/v1/embeddings` backend both use this. `encode` is
synchronous and thread-safe; `aencode` goes through the dynamic batcher so concurrent callers
share engine runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from prometheus_client import CollectorRegistry

from backends.batcher import Batcher
from backends.errors import EngineError
from backends.local.artifacts import file_hash, resolve
from backends.local.engine import Engine
from backends.local.metrics import LocalMetrics
from backends.local.progress import LoadProgress
from backends.local.sentences import read_sentences
from backends.local.shared import EngineShare
from backends.preprocess.cpu import TextPreprocessor, Tokens, mean_pool_normalise, pad_tokens
from backends.settings import BatcherSettings, SessionOptions

log = logging.getLogger("latentgate.local")

# Batches with more characters than this are tokenised in a worker thread: the event loop
# keeps answering (health checks, cache hits) while a large request is prepared.
_INLINE_CHARS = 4096

DEFAULT_MODEL = "builtin:all-MiniLM-L6-v2"


class TextEncoder:
    """name, dim, device ("cpu" | "cuda") and providers describe where it runs."""

    def __init__(
        self,
        name: str,
        engine: Engine,
        preprocessor: TextPreprocessor,
        batching: BatcherSettings | None = None,
        metrics: LocalMetrics | None = None,
        output: str = "token_embeddings",
    ) -> None:
        self.name = name
        self.engine = engine
        self.device: str = engine.device
        self.providers: list[str] = list(engine.providers)
        self.preprocessor = preprocessor
        self.max_tokens = preprocessor.max_tokens
        self._output = output
        self._masked = any(s.name == "attention_mask" for s in engine.inputs)
        self._gpu_pre: Any = None
        if self.device == "cuda":
            self._gpu_pre = _gpu_preprocessor()
        spec = next((o for o in engine.outputs if o.name == output), None)
        if spec is None:
            raise EngineError(f"model {name} has no output {output!r}")
        self.dim: int = spec.shape[-1] if spec.shape and spec.shape[-1] > 0 else 0
        self._batcher: Batcher[Tokens, NDArray[np.float32] | Exception] = Batcher(
            name,
            self._run_rows,
            batching or BatcherSettings(),
            length=lambda t: len(t.ids),
            metrics=metrics,
        )
        self.ready = False
        # What the vectors depend on (set by load_text_encoder; the semantic cache keys its
        # shared index and labels by them): the weights, the tokenizer, and a lossy precision.
        self.model_hash = ""
        self.tokenizer_hash = ""
        self.precision = "fp32"

    def warmup(self) -> float:
        """Run a few batch shapes once so the first request pays no graph/allocator set-up."""
        t0 = time.perf_counter()
        for n in (1, 4):
            vecs = self.encode(["latentgate warm-up sentence"] * n)
            self.dim = int(vecs.shape[1])
        self.ready = True
        took = time.perf_counter() - t0
        # The device is said once, when the session loads (backends.local.onnx).
        log.info("engine %s warm in %.0f ms (dim %d)", self.name, took * 1e3, self.dim)
        return took

    def tokenize(self, texts: Sequence[str]) -> list[Tokens]:
        return self.preprocessor.tokenize(texts)

    def unknown_spans(self, text: str) -> tuple[str, ...]:
        """The spans of `text` the tokenizer maps to its unknown token: the model reads each as
        the same token, whatever it says (backends.preprocess.unknown)."""
        return self.preprocessor.unknown.spans(text)

    def encode(self, texts: list[str]) -> NDArray[np.float32]:
        """(n, dim) float32, L2-normalised rows. Raises BadInput for too-long inputs."""
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        return self.encode_tokens(self.tokenize(texts))

    def encode_tokens(self, tokens: Sequence[Tokens]) -> NDArray[np.float32]:
        # A text's vector must not depend on the texts run beside it, nor on their padding.
        if not self.engine.batch_invariant and len(tokens) > 1:
            return np.concatenate([self.encode_tokens([t]) for t in tokens])
        if not self._masked and len({len(t.ids) for t in tokens}) > 1:
            return self._by_length(tokens)
        if self._gpu_pre is not None:
            feeds = self._gpu_pre.pad_tokens(tokens)
            mask = self._gpu_pre.to_numpy(feeds["attention_mask"])
        else:
            feeds = pad_tokens(tokens)
            mask = feeds["attention_mask"]
        hidden = self.engine.run(feeds)[self._output]
        return mean_pool_normalise(hidden.astype(np.float32, copy=False), mask)

    def _by_length(self, tokens: Sequence[Tokens]) -> NDArray[np.float32]:
        """A model without an attention mask reads padding as text: only texts of one length
        share a run (no padding at all), and the rows go back in their order."""
        groups: dict[int, list[int]] = {}
        for i, t in enumerate(tokens):
            groups.setdefault(len(t.ids), []).append(i)
        rows: dict[int, NDArray[np.float32]] = {}
        for idx in groups.values():
            rows.update(zip(idx, self.encode_tokens([tokens[i] for i in idx]), strict=True))
        return np.stack([rows[i] for i in range(len(tokens))])

    def _run_rows(self, batch: list[Tokens]) -> list[NDArray[np.float32] | Exception]:
        """A batch that fails runs again text by text: a text the model refuses (a token id past
        its embedding table, say) fails the request that sent it, not its batch mates."""
        try:
            return list(self.encode_tokens(batch))
        except Exception as exc:
            if len(batch) == 1:
                return [exc]
        return [self._run_rows([t])[0] for t in batch]

    async def atokenize(self, texts: Sequence[str]) -> list[Tokens]:
        """tokenize, off the event loop when the batch is large."""
        if sum(len(t) for t in texts) <= _INLINE_CHARS:
            return self.tokenize(texts)
        return await asyncio.to_thread(self.tokenize, texts)

    async def aencode(self, texts: list[str]) -> NDArray[np.float32]:
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        return await self.aencode_tokens(await self.atokenize(texts))

    async def aencode_tokens(self, tokens: Sequence[Tokens]) -> NDArray[np.float32]:
        got = await self._batcher.submit(tokens)
        rows = [r for r in got if not isinstance(r, Exception)]
        if len(rows) < len(got):
            raise next(r for r in got if isinstance(r, Exception))  # this request's own text
        if len(rows) > 64:  # stacking thousands of rows is milliseconds of loop time
            return await asyncio.to_thread(_stack, rows)
        return _stack(rows)

    async def aclose(self) -> None:
        await self._batcher.aclose()
        self.engine.close()


def _stack(rows: list[NDArray[np.float32]]) -> NDArray[np.float32]:
    return np.stack(rows).astype(np.float32, copy=False)


def _gpu_preprocessor() -> Any:
    from backends.preprocess.gpu import GpuPreprocessor, cuda_available

    if not cuda_available():
        log.warning("engine on CUDA but torch sees no GPU: preprocessing stays on the CPU")
        return None
    return GpuPreprocessor()


def _calibration_batches(
    tokenizer: Path, path: str | None, max_tokens: int, batch: int
) -> Callable[[], Iterator[dict[str, NDArray[np.int64]]]] | None:
    """INT8 calibration feeds: full batches of the file's texts (TensorRT wants a fixed size)."""
    if path is None:
        return None
    texts = read_sentences(path, limit=max(batch, 512))
    pre = TextPreprocessor.from_file(str(tokenizer), max_tokens, True)

    def batches() -> Iterator[dict[str, NDArray[np.int64]]]:
        for i in range(0, len(texts) - batch + 1, batch):
            yield pad_tokens(pre.tokenize(texts[i : i + batch]))

    return batches


def load_text_encoder(
    model: str = DEFAULT_MODEL,
    providers: str | list[str] = "auto",
    *,
    artifacts_dir: str | None = None,
    tokenizer: str | None = None,
    max_tokens: int | None = None,
    truncate: bool = True,
    batching: BatcherSettings | None = None,
    session: SessionOptions | None = None,
    registry: CollectorRegistry | None = None,
    metrics: LocalMetrics | None = None,
    engine: str = "onnxruntime",
    precision: str = "fp32",
    calibration: str | None = None,
    warmup: bool = True,
    share: EngineShare | None = None,
    progress: LoadProgress | None = None,
) -> TextEncoder:
    """Build a warm TextEncoder. `engine="tensorrt"` raises EngineError where tensorrt is absent."""
    # TensorRT lowers precision itself from the FP32 graph; ORT serves a promoted artifact.
    art = resolve(
        model, artifacts_dir, tokenizer, "fp32" if engine == "tensorrt" else precision, progress
    )
    if progress is not None:
        progress.step("load", str(art.serving_path(engine, precision)))
    if art.tokenizer_path is None:
        raise EngineError(f"model {model} needs a tokenizer.json (preprocess.tokenizer)")
    limit = max_tokens or art.max_tokens or 512
    if metrics is None and registry is not None:
        metrics = LocalMetrics(registry)
    eng: Engine
    if engine == "tensorrt":
        from backends.local.tensorrt import TrtEngine

        max_batch = (batching or BatcherSettings()).max_batch
        calib = _calibration_batches(art.tokenizer_path, calibration, limit, max_batch)
        eng = TrtEngine.from_onnx(
            art,
            precision=precision,
            max_tokens=limit,
            max_batch=max_batch,
            calibration=calib,
            artifacts_dir=artifacts_dir,
            metrics=metrics,
        )
    else:
        from backends.local.onnx import OrtEngine

        path = str(art.serving_path(engine, precision))

        def build() -> Engine:
            return OrtEngine(path, art.name, providers, session, metrics)

        # One session per file and settings: the semantic embedder and a local backend of the
        # same model share it (backends.local.shared).
        key = (path, repr(providers), repr(session or SessionOptions()))
        eng = share.acquire(key, build) if share is not None else build()
    pre = TextPreprocessor.from_file(str(art.tokenizer_path), limit, truncate)
    enc = TextEncoder(art.name, eng, pre, batching, metrics)
    enc.model_hash, enc.tokenizer_hash = art.model_hash, file_hash(art.tokenizer_path)
    enc.precision = precision
    if warmup:
        if progress is not None:
            progress.step("warmup")
        enc.warmup()
    return enc
