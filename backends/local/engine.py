"""Engine contract: named input/output tensor specs and `run(feeds) → outputs` on whole batches.

Engines are synchronous and thread-safe; the batcher calls them from its worker thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

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
}


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
    # False when a row's output depends on the other rows of its run (a dynamically quantized
    # graph takes its activation scales over the whole input): callers then run rows one by one.
    batch_invariant: bool

    def run(self, feeds: dict[str, NDArray[Any]]) -> dict[str, NDArray[Any]]: ...

    def close(self) -> None: ...
