"""Local engines: models run in-process on ONNX Runtime or TensorRT, behind the dynamic batcher.

The public face other packages use (the semantic cache's embedder and cross-encoder, the CLI's
build). Heavy modules load on first use: importing this package pulls in neither onnxruntime's
session code nor torch (the export runs in a child process that imports torch itself).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from backends.local.artifacts import (
    EXPORT_REV,
    builtin_dir,
    default_artifacts_dir,
    file_hash,
    fused,
)
from backends.local.export_runner import die_with_parent, run_export, usable
from backends.local.metrics import LocalMetrics
from backends.local.progress import LoadProgress
from backends.local.shared import EngineShare
from backends.local.text_encoder import TextEncoder, load_text_encoder

if TYPE_CHECKING:
    from backends.local.build import run_build
    from backends.local.export import export_text_model
    from backends.local.onnx import OrtEngine

_LAZY = {
    "OrtEngine": "backends.local.onnx",
    "export_text_model": "backends.local.export",
    "run_build": "backends.local.build",
}

__all__ = [
    "EXPORT_REV",
    "EngineShare",
    "LoadProgress",
    "LocalMetrics",
    "OrtEngine",
    "TextEncoder",
    "builtin_dir",
    "default_artifacts_dir",
    "die_with_parent",
    "export_text_model",
    "file_hash",
    "fused",
    "load_text_encoder",
    "run_build",
    "run_export",
    "usable",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'backends.local' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
