"""Engine contract: named input/output tensor specs and `run(feeds) → outputs` on whole batches.

Engines are synchronous and thread-safe; the batcher calls them from its worker thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

# ONNX / TensorRT element types → Open Inference Protocol datatypes.
V2_DATATYPES: dict[str, str] = {
    "float": "FP32",
    "float32": "FP32",
    "float16": "FP16",
    "double": "FP64",
    "float64": "FP64",
    "int64": "INT64",
    "int32": "INT32",
    "int16": "INT16",
    "int8": "INT8",
    "uint8": "UINT8",
    "bool": "BOOL",
}


# Open Inference Protocol numeric datatypes → numpy (little-endian, as the binary extension
# lays them out). The one table: the v2 adapter and the local v2 codec both read it.
V2_NUMERIC: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype("<u1"), "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"), "UINT64": np.dtype("<u8"), "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"), "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A tensor's name, v2 datatype and shape; -1 marks a dynamic dimension."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def numpy_dtype(self) -> np.dtype[Any]:
        return V2_NUMERIC[self.datatype].newbyteorder("=")


class Engine(Protocol):
    name: str
    device: str  # "cpu" or "cuda"
    providers: list[str]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]

    def run(self, feeds: dict[str, NDArray[Any]]) -> dict[str, NDArray[Any]]: ...

    def close(self) -> None: ...
