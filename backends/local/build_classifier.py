"""`latentgate build` for classifiers: which task a model has, its logits, top-1 agreement.

A classifier here is a text model whose output is logits `(batch, classes)`; the embedder path
(token embeddings → mean-pooled cosine) stays in build.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from backends.errors import EngineError
from backends.local.artifacts import ModelArtifact
from backends.local.engine import TensorSpec
from backends.local.onnx import OrtEngine
from backends.preprocess.cpu import TextPreprocessor, pad_tokens

EMBEDDER_OUTPUT = "token_embeddings"
_FLOATS = {"FP32", "FP16", "FP64"}


def top1_agreement(reference: NDArray[Any], candidate: NDArray[Any]) -> float:
    """For classifiers: the share of inputs whose arg-max class is unchanged."""
    return float((reference.argmax(axis=-1) == candidate.argmax(axis=-1)).mean())


def _softmax(logits: NDArray[Any]) -> NDArray[np.float64]:
    z = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class Agreement:
    top1: float  # share of inputs with the same arg-max class as FP32
    flipped: int  # how many inputs changed class
    max_prob_drift: float  # mean |max softmax(fp32) - max softmax(candidate)|


def agreement(reference: NDArray[Any], candidate: NDArray[Any]) -> Agreement:
    flipped = int((reference.argmax(axis=-1) != candidate.argmax(axis=-1)).sum())
    drift = np.abs(_softmax(reference).max(axis=-1) - _softmax(candidate).max(axis=-1))
    return Agreement(top1_agreement(reference, candidate), flipped, float(drift.mean()))


def detect_task(outputs: list[TensorSpec], task: str, model: str) -> tuple[str, str]:
    """(task, output name) from `task` ("auto" | "embedder" | "classifier") and the graph outputs.

    auto: token embeddings (named so, or any 3-D float output) → embedder; else a 2-D float
    output (batch, classes) → classifier.
    """
    floats = [o for o in outputs if o.datatype in _FLOATS]
    logits = next((o.name for o in floats if len(o.shape) == 2), None)
    named = ", ".join(f"{o.name} {o.datatype}{list(o.shape)}" for o in outputs)
    if task == "embedder" or (
        task == "auto" and any(o.name == EMBEDDER_OUTPUT or len(o.shape) == 3 for o in floats)
    ):
        return "embedder", EMBEDDER_OUTPUT
    if logits is not None:
        return "classifier", logits
    if task == "classifier":
        raise EngineError(
            f"model {model} has no 2-D float output (batch, classes) to compare as a classifier "
            f"(its outputs: {named})"
        )
    raise EngineError(
        f"cannot tell whether {model} is an embedder or a classifier from its outputs ({named}): "
        "pass --task embedder|classifier"
    )


def model_outputs(path: Path, name: str) -> list[TensorSpec]:
    engine = OrtEngine(str(path), name, ["CPUExecutionProvider"])
    outputs = list(engine.outputs)
    engine.close()
    return outputs


def logits_runner(
    path: Path, art: ModelArtifact, output: str
) -> Callable[[list[str]], NDArray[np.float32]]:
    """texts → the model's `output` as float32 rows (tokenizer ids and mask in, truncated)."""
    assert art.tokenizer_path is not None
    engine = OrtEngine(str(path), art.name, ["CPUExecutionProvider"])
    pre = TextPreprocessor.from_file(str(art.tokenizer_path), art.max_tokens or 512, True)

    def run(texts: list[str]) -> NDArray[np.float32]:
        out = engine.run(pad_tokens(pre.tokenize(texts)))[output]
        return out.astype(np.float32, copy=False)

    return run
