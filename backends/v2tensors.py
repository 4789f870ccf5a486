"""Open Inference Protocol (KServe v2) tensors, once for the whole gateway: the datatype table,
element counts, BYTES elements and nested JSON data, and a local model's Triton config.

The HTTP v2 adapter (keys), the gRPC codec and the local engines' codec all read these; what a
client got wrong is a BadInput naming the tensor, which every edge turns into its own 400.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from backends.errors import BadInput

BINARY_HEADER = "inference-header-content-length"

# Numeric datatypes → numpy, little-endian as the binary extension lays them out.
V2_NUMERIC: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype("<u1"), "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"), "UINT64": np.dtype("<u8"), "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"), "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
}  # fmt: skip
# Every datatype the protocol names; BF16 and BYTES have no fixed numpy layout: None.
V2_DTYPES: dict[str, np.dtype[Any] | None] = {**V2_NUMERIC, "BF16": None, "BYTES": None}
# Bytes per element of the fixed-width datatypes (all but BYTES).
ITEMSIZE: dict[str, int] = {k: v.itemsize for k, v in V2_NUMERIC.items()} | {"BF16": 2}

# No tensor the gateway handles has more elements than this; larger shapes are refused before
# any arithmetic on them (a product computed in int64 wraps: [7, 7905747460161236407] → 1).
MAX_ELEMENTS = 1 << 40


def parse_header_length(value: str, body_size: int) -> int:
    """The binary extension's Inference-Header-Content-Length, in ASCII digits only. Python's
    int() also takes "123_4", " 12 ", "+12" and other scripts' digits ("١٢"), which Triton's
    atoi reads as another length (123, 12, 12, 0): the key would split the body at one place
    and the upstream at another, and store the upstream's answer for one request under the
    key of another."""
    if not (value.isascii() and value.isdigit()):
        raise BadInput("Inference-Header-Content-Length must be an integer (ASCII digits)")
    n = int(value)
    if n > body_size:
        raise BadInput("Inference-Header-Content-Length is larger than the body")
    return n


def is_dim(d: object) -> bool:
    """A shape entry: a non-negative integer. Not a bool (an int to Python): `[true]` is no
    shape a model server takes, and read as 1 it keyed apart from `[1]`."""
    return isinstance(d, int) and not isinstance(d, bool) and d >= 0


def element_count(name: str, shape: list[int]) -> int:
    """The element count of a shape, in Python integers (no wrap-around), bounded."""
    count = math.prod(shape)
    if count > MAX_ELEMENTS:
        raise BadInput(f"input '{name}': shape {shape} has more than {MAX_ELEMENTS} elements")
    return count


def flatten(data: Any) -> list[Any]:
    """Nested JSON `data` (row-major) → a flat list."""
    if isinstance(data, list):
        if not any(issubclass(t, list) for t in set(map(type, data))):
            # (a flat list, as tritonclient sends it: one call per element took 0.1 s a MB)
            return list(data)
        out: list[Any] = []
        for item in data:
            out.extend(flatten(item))
        return out
    return [data]


def bytes_elements(raw: bytes, name: str) -> list[bytes]:
    """A BYTES tensor's binary form (each element: little-endian u32 length, then its bytes)."""
    out, i = [], 0
    while i < len(raw):
        if i + 4 > len(raw):
            raise BadInput(f"input '{name}': truncated BYTES element length")
        (n,) = struct.unpack_from("<I", raw, i)
        i += 4
        if i + n > len(raw):
            raise BadInput(f"input '{name}': a BYTES element runs past the end of its data")
        out.append(raw[i : i + n])
        i += n
    return out


def model_config(meta: dict[str, Any]) -> dict[str, Any]:
    """Triton's model configuration (GET .../config) from v2 metadata: the full shapes as dims
    (max_batch_size 0: the batch is the first dimension, batched by the gateway itself)."""

    def tensors(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {
                "name": t["name"],
                "data_type": "TYPE_STRING" if t["datatype"] == "BYTES" else f"TYPE_{t['datatype']}",
                "dims": t["shape"],
            }
            for t in specs
        ]

    platform = meta["platform"]
    return {
        "name": meta["name"], "platform": platform,
        "backend": "tensorrt" if platform == "tensorrt_plan" else "onnxruntime",
        "version_policy": {"latest": {"num_versions": 1}}, "max_batch_size": 0,
        "input": tensors(meta["inputs"]), "output": tensors(meta["outputs"]),
    }  # fmt: skip
