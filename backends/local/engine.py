"""Engine contract: named input/output tensor specs and `run(feeds) → outputs` on whole batches.

Engines are synchronous and thread-safe; the batcher calls them from its worker thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from backends.errors import EngineError
from backends.v2tensors import V2_NUMERIC

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
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "string": "BYTES",  # (ONNX string tensors: v2 has no STRING; its strings are BYTES)
}


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A tensor's name, v2 datatype and shape; -1 marks a dynamic dimension."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def numpy_dtype(self) -> np.dtype[Any]:
        """numpy's dtype for the engine (BYTES: Python str objects, as ONNX Runtime takes and
        gives string tensors). EngineError for a datatype local models do not serve."""
        if self.datatype == "BYTES":
            return np.dtype(object)
        dtype = V2_NUMERIC.get(self.datatype)
        if dtype is None:
            raise EngineError(
                f"tensor '{self.name}' is {self.datatype}, which local models do not serve "
                f"(they take {', '.join(V2_NUMERIC)} and BYTES)"
            )
        return dtype.newbyteorder("=")


class Engine(Protocol):
    name: str
    device: str  # "cpu" or "cuda"
    providers: list[str]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    # False when a row's output depends on the other rows of its run (a dynamically quantized
    # graph takes its activation scales over the whole input): callers then run rows one by one.
    batch_invariant: bool

    def run(self, feeds: dict[str, NDArray[Any]]) -> dict[str, NDArray[Any]]: ...

    def close(self) -> None: ...
