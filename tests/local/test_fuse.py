"""The builtin is served as ONNX Runtime's fused graph; a graph that does not fuse falls back."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import numpy as np
import onnx
import pytest

from backends.local.artifacts import builtin_dir, fused, resolve
from backends.local.text_encoder import TextEncoder
from backends.preprocess.cpu import pad_tokens
from tests.local.conftest import SENTENCES, artifacts_dir
from tests.local.test_tensor_model import channel_means_model


def test_builtin_serves_the_fused_graph_and_it_matches_the_portable_one(
    encoder: TextEncoder,
) -> None:
    art = resolve("builtin:all-MiniLM-L6-v2", artifacts_dir())
    assert art.fused_path is not None and art.fused_path.is_file()
    assert art.serving_path("onnxruntime", "fp32") == art.fused_path
    # TensorRT and `latentgate build` keep the portable export (standard ONNX ops only).
    assert art.serving_path("tensorrt", "fp32") == art.onnx_path
    ops = {n.op_type for n in onnx.load(str(art.fused_path), load_external_data=False).graph.node}
    assert {"Attention", "SkipLayerNormalization"} <= ops
    portable = {n.op_type for n in onnx.load(str(art.onnx_path)).graph.node}
    assert "Attention" not in portable

    import onnxruntime as ort

    plain = ort.InferenceSession(str(art.onnx_path), providers=["CPUExecutionProvider"])
    feeds = pad_tokens(encoder.tokenize(SENTENCES))  # padded rows: the mask must be honoured
    hidden = plain.run(None, feeds)[0]
    m = feeds["attention_mask"][..., None].astype(np.float32)
    ref = (hidden * m).sum(1) / m.sum(1)
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    served = encoder.encode(SENTENCES)
    assert float((served * ref).sum(axis=1).min()) > 0.99999


def test_the_log_names_the_graph_an_engine_serves(caplog: pytest.LogCaptureFixture) -> None:
    from backends.local.text_encoder import load_text_encoder

    with caplog.at_level(logging.INFO, "latentgate.local"):
        enc = load_text_encoder(providers=["CPUExecutionProvider"], artifacts_dir=artifacts_dir())
    assert "graph model.fp32.fused.onnx" in caplog.text
    asyncio.run(enc.aclose())


def test_a_graph_that_does_not_fuse_is_served_as_is_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "means.onnx"
    channel_means_model(path)
    config = builtin_dir("all-MiniLM-L6-v2") / "config.json"
    with caplog.at_level(logging.WARNING, "latentgate.local"):
        assert fused(path, config) is None
    assert "serving the unfused graph" in caplog.text and "no attention fused" in caplog.text
    marker = tmp_path / "means.fused.skipped"
    assert marker.is_file() and "no attention fused" in marker.read_text()
    caplog.clear()
    assert fused(path, config) is None  # the marker: no second attempt, no second warning
    assert caplog.text == ""
    assert not (tmp_path / "means.fused.onnx").exists()
