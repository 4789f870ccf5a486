"""Preprocessing on the CPU: text → token ids and mask (tokenizers), image bytes → NCHW (Pillow).

backends/preprocess/gpu.py has the same functions on device tensors; both return numpy arrays
shaped for the engine, so the engine never knows where preprocessing ran.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from tokenizers import Encoding, Tokenizer

from backends.errors import BadInput
from backends.settings import ImagePreprocess


@dataclass(frozen=True, slots=True)
class Tokens:
    """One text's token ids (unpadded); `len(ids)` is what the batcher buckets on."""

    ids: NDArray[np.int64]
    type_ids: NDArray[np.int64]


class TextPreprocessor:
    """Thread-safe: the tokenizer is configured once here and never mutated afterwards."""

    device = "cpu"

    def __init__(self, tokenizer: Tokenizer, max_tokens: int, truncate: bool) -> None:
        self.max_tokens = max_tokens
        self.truncate = truncate
        self._tok = tokenizer
        self._tok.no_padding()
        if truncate:
            self._tok.enable_truncation(max_tokens)
        else:
            self._tok.no_truncation()

    @classmethod
    def from_file(cls, path: str, max_tokens: int, truncate: bool) -> TextPreprocessor:
        return cls(Tokenizer.from_file(path), max_tokens, truncate)

    def tokenize(self, texts: Sequence[str]) -> list[Tokens]:
        """Raise BadInput naming the first input that is too long (when not truncating)."""
        encs: list[Encoding] = self._tok.encode_batch(list(texts))
        out = []
        for i, e in enumerate(encs):
            if len(e.ids) > self.max_tokens:
                raise BadInput(
                    f"input[{i}] has {len(e.ids)} tokens; "
                    f"this model takes at most {self.max_tokens}"
                )
            out.append(Tokens(np.asarray(e.ids, np.int64), np.asarray(e.type_ids, np.int64)))
        return out


def pad_tokens(batch: Sequence[Tokens], to: int | None = None) -> dict[str, NDArray[np.int64]]:
    """Right-pad to the longest item (or `to`): input_ids, attention_mask, token_type_ids."""
    width = max(len(t.ids) for t in batch) if to is None else to
    ids = np.zeros((len(batch), width), np.int64)
    mask = np.zeros((len(batch), width), np.int64)
    types = np.zeros((len(batch), width), np.int64)
    for row, t in enumerate(batch):
        n = len(t.ids)
        ids[row, :n] = t.ids
        mask[row, :n] = 1
        types[row, :n] = t.type_ids
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def mean_pool_normalise(
    hidden: NDArray[np.float32], mask: NDArray[np.int64]
) -> NDArray[np.float32]:
    """Mean over real tokens, then L2 normalisation (sentence-transformers' MiniLM head)."""
    m = mask[..., None].astype(np.float32)
    summed = (hidden * m).sum(axis=1)
    pooled = summed / np.clip(m.sum(axis=1), 1e-9, None)
    norms = np.linalg.norm(pooled, axis=1, keepdims=True)
    out: NDArray[np.float32] = (pooled / np.clip(norms, 1e-12, None)).astype(np.float32)
    return out


def decode_image(data: bytes, spec: ImagePreprocess) -> NDArray[np.float32]:
    """bytes → RGB → resize (bilinear) → scale to [0, 1] → normalise → CHW float32."""
    from PIL import Image, UnidentifiedImageError

    if len(data) > spec.max_bytes:
        raise BadInput(f"image of {len(data)} bytes exceeds the limit of {spec.max_bytes}")
    try:
        with Image.open(io.BytesIO(data)) as img:
            rgb = img.convert("RGB").resize(spec.size[::-1], Image.Resampling.BILINEAR)
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise BadInput(f"image could not be decoded: {exc}") from None
    arr = np.asarray(rgb, np.float32) / 255.0
    mean = np.asarray(spec.mean, np.float32)
    std = np.asarray(spec.std, np.float32)
    chw: NDArray[np.float32] = np.ascontiguousarray(((arr - mean) / std).transpose(2, 0, 1))
    return chw


def images_to_nchw(images: Sequence[bytes], spec: ImagePreprocess) -> NDArray[np.float32]:
    return (
        np.stack([decode_image(b, spec) for b in images])
        if images
        else np.zeros((0, 3, *spec.size), np.float32)
    )
