"""Preprocessing on the CPU: text → token ids and mask (tokenizers), image bytes → NCHW (Pillow).

backends/preprocess/gpu.py has the same functions on device tensors; both return numpy arrays
shaped for the engine, so the engine never knows where preprocessing ran.
"""

from __future__ import annotations

import base64
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from tokenizers import Encoding, Tokenizer

from backends.errors import BadInput, EngineError
from backends.preprocess.unknown import UnknownSpans
from backends.settings import ImagePreprocess

# A WordPiece/BPE token covers a handful of characters (English averages ~4); no real text needs
# more than this many per token, so a text is cut to max_tokens * CHARS_PER_TOKEN characters
# before tokenising: the tokenizer never sees (or allocates for) more than a bounded prefix.
CHARS_PER_TOKEN = 64


# Texts tokenised at a time when an input over the window is refused, not cut
_REFUSE_STEP = 64


def char_limit(max_tokens: int) -> int:
    return max_tokens * CHARS_PER_TOKEN


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
        # what the model cannot read apart (configured as above: it sees what the model sees)
        self.unknown = UnknownSpans(self._tok, self.max_chars, max_tokens if truncate else None)

    @classmethod
    def from_file(cls, path: str, max_tokens: int, truncate: bool) -> TextPreprocessor:
        try:
            tokenizer = Tokenizer.from_file(path)
        except Exception as exc:  # the tokenizers library raises a bare Exception
            raise EngineError(f"tokenizer {path} does not load: {exc}") from None
        return cls(tokenizer, max_tokens, truncate)

    @property
    def max_chars(self) -> int:
        return char_limit(self.max_tokens)

    def tokenize(self, texts: Sequence[str]) -> list[Tokens]:
        """Raise BadInput naming the first input that is too long (when not truncating).

        Work is bounded by characters first: without truncation a text over max_chars is refused
        untokenised; with it, only its first max_chars characters are tokenised."""
        limit = self.max_chars
        cut = []
        for i, t in enumerate(texts):
            if len(t) > limit:
                if not self.truncate:
                    raise BadInput(
                        f"input[{i}] has {len(t)} characters; this model takes at most "
                        f"{self.max_tokens} tokens ({limit} characters)"
                    )
                t = t[:limit]
            cut.append(t)
        # Without truncation a request is refused at its first input over the window: tokenised
        # a slice at a time, a refused request costs a slice, not all of it (2,048 inputs of
        # 16K characters each took 7 s before their 400). (At least 1: range() refuses a step
        # of 0, which an empty list would be.)
        step = max(len(cut), 1) if self.truncate else _REFUSE_STEP
        out = []
        for start in range(0, len(cut), step):
            encs: list[Encoding] = self._tok.encode_batch(cut[start : start + step])
            for i, e in enumerate(encs, start):
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


def open_image(data: bytes, spec: ImagePreprocess) -> Any:
    """The image with its header read and no pixel decoded (a PIL Image; the caller closes it).
    BadInput when it is over max_bytes, declares more than max_pixels, or is not an image.

    The pixel count is checked from the header: decoding holds ~4 bytes a pixel whatever the
    file's size, and Pillow's own guard (Image.MAX_IMAGE_PIXELS, process-wide) only warns below
    twice its 89 M. Its DecompressionBombError was no OSError: a 500, UNKNOWN over gRPC."""
    from PIL import Image, UnidentifiedImageError

    if len(data) > spec.max_bytes:
        raise BadInput(f"image of {len(data)} bytes exceeds the limit of {spec.max_bytes}")
    try:
        img = Image.open(io.BytesIO(data))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        # (the warning is raised only where warnings are errors; either way it is too large)
        raise BadInput(f"image declares {_over_limit(spec)}") from None
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise BadInput(f"image could not be decoded: {_reason(exc)}{_hint(data)}") from None
    width, height = img.size
    if width * height > spec.max_pixels:
        img.close()
        raise BadInput(f"image of {width}x{height} declares {_over_limit(spec)}")
    return img


def _over_limit(spec: ImagePreprocess) -> str:
    return f"more pixels than the limit of {spec.max_pixels} (preprocess.max_pixels)"


def _reason(exc: Exception) -> str:
    # Pillow names the stream object it read from ("<_io.BytesIO object at 0x...>"): noise
    return str(exc).split(" <_io.", 1)[0]


# What image files start with: a BYTES element that is such a file in base64 was sent encoded
_MAGIC = (b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"RIFF", b"BM", b"II*\x00", b"MM\x00*")


def _hint(data: bytes) -> str:
    """What to send instead, when the element is a URL or an image in base64 (standard or
    URL-safe, wrapped or not): the gateway decodes neither, nor fetches any URL."""
    if data[:16].lstrip().lower().startswith((b"data:", b"http://", b"https://", b"file:")):
        return "; send the image file's bytes, not a URL (the gateway fetches nothing)"
    text = re.sub(rb"\s+", b"", data[:64]).replace(b"-", b"+").replace(b"_", b"/")
    try:
        head = base64.b64decode(text[: len(text) // 4 * 4], validate=True)
    except ValueError:  # (binascii.Error)
        return ""
    if head.startswith(_MAGIC):
        return "; send the image file's bytes (the binary tensor extension), not base64"
    return ""


def _rgb(img: Any) -> Any:
    """The image as 8-bit RGB. Pillow takes 16-bit greyscale to 8 bits by clipping at 255,
    not by scaling: a mid-grey (32768) came out white, and so did nearly every pixel of a
    16-bit scan. Its high byte is what Pillow itself keeps of a 16-bit colour PNG."""
    from PIL import Image

    if img.mode.startswith("I;16"):
        img = Image.fromarray((np.asarray(img).astype(np.uint16) >> 8).astype(np.uint8))
    return img.convert("RGB")


def decode_image(data: bytes, spec: ImagePreprocess) -> NDArray[np.float32]:
    """bytes → RGB → resize (bilinear) → scale to [0, 1] → normalise → CHW float32."""
    from PIL import Image

    with open_image(data, spec) as img:
        try:
            rgb = _rgb(img).resize(spec.size[::-1], Image.Resampling.BILINEAR)
        except (OSError, ValueError, Image.DecompressionBombError) as exc:
            raise BadInput(f"image could not be decoded: {_reason(exc)}") from None
    arr = np.asarray(rgb, np.float32) / 255.0
    mean = np.asarray(spec.mean, np.float32)
    std = np.asarray(spec.std, np.float32)
    chw: NDArray[np.float32] = np.ascontiguousarray(((arr - mean) / std).transpose(2, 0, 1))
    return chw


def images_to_nchw(images: Sequence[bytes], spec: ImagePreprocess) -> NDArray[np.float32]:
    """Encoded images → one NCHW batch; no images is BadInput, as on the GPU path (a graph
    run on no rows answers nothing that was asked)."""
    if not images:
        raise BadInput("no images to preprocess; send at least one")
    return np.stack([decode_image(b, spec) for b in images])
