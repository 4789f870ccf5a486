"""OpenAI `/v1/embeddings` for local embedders: request parsing and the response body.

The OpenAI SDK asks for `encoding_format: base64` by default (little-endian float32). A body is
JSON or msgpack, and `dimensions` an integer or an integral float, as the cache key reads them
(backends.bodies): a request the key calls the same gets the same answer, hit or miss.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from backends.bodies import as_integer, load_document
from backends.errors import BadInput

MAX_INPUTS = 2048


@dataclass(frozen=True, slots=True)
class EmbeddingsRequest:
    model: str
    texts: list[str]
    encoding_format: str
    dimensions: int | None


def parse_embeddings(body: bytes, content_type: str | None = None) -> EmbeddingsRequest:
    doc = load_document(content_type, body, "request body")
    if not isinstance(doc, dict):
        raise BadInput("request body must be an object")
    model, raw = doc.get("model"), doc.get("input")
    if not isinstance(model, str):
        raise BadInput("'model' is required and must be a string")
    texts: list[str]
    if isinstance(raw, str):
        texts = [raw]
    elif isinstance(raw, list) and raw and all(isinstance(t, str) for t in raw):
        texts = list(raw)
    elif isinstance(raw, list) and raw and all(isinstance(t, int | list) for t in raw):
        raise BadInput("'input' as token ids is not supported by local models; send text")
    else:
        raise BadInput("'input' must be a string or a non-empty array of strings")
    if len(texts) > MAX_INPUTS:
        raise BadInput(f"'input' has {len(texts)} items; at most {MAX_INPUTS} per request")
    for i, t in enumerate(texts):
        if not t:
            raise BadInput(f"input[{i}] is an empty string")
        try:
            t.encode("utf-8")
        except UnicodeEncodeError:  # JSON lets "\ud800" through; no text has a lone surrogate
            raise BadInput(f"input[{i}] is not valid Unicode (a lone surrogate)") from None
    fmt = doc.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise BadInput("'encoding_format' must be 'float' or 'base64'")
    raw_dims = doc.get("dimensions")
    dims = as_integer(raw_dims)
    if raw_dims is not None and dims is None:
        raise BadInput("'dimensions' must be an integer")
    return EmbeddingsRequest(model, texts, fmt, dims)


def embeddings_response(
    model: str, vectors: NDArray[np.float32], prompt_tokens: int, encoding_format: str
) -> bytes:
    data: list[dict[str, Any]] = []
    for i, row in enumerate(vectors):
        emb: Any = (
            base64.b64encode(np.ascontiguousarray(row, "<f4").tobytes()).decode()
            if encoding_format == "base64"
            else row.tolist()
        )
        data.append({"object": "embedding", "index": i, "embedding": emb})
    doc = {
        "object": "list", "data": data, "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }  # fmt: skip
    return json.dumps(doc).encode()
