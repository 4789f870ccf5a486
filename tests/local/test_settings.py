"""Local backend settings: validated like every other config section, errors with path and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import ConfigError, parse_settings

CONFIG = """
backends:
  minilm:
    kind: onnxruntime
    model: builtin:all-MiniLM-L6-v2
    batching: {max_batch: 0, max_delay_msec: 2}
routes:
  - {name: e, match: {path: /v1/embeddings}, protocol: openai, backend: minilm}
"""


def test_bad_batching_settings_name_path_and_line() -> None:
    with pytest.raises(ConfigError) as err:
        parse_settings(CONFIG)
    issues = {str(i) for i in err.value.issues}
    assert any(i.startswith("backends.minilm.batching.max_batch (line 6)") for i in issues)
    assert "backends.minilm.batching.max_delay_msec (line 6): unknown key" in issues


def test_defaults_batch_and_pick_providers_automatically() -> None:
    settings = parse_settings(CONFIG.replace("max_batch: 0, max_delay_msec: 2", "max_batch: 8"))
    spec = settings.backends["minilm"]
    assert spec.kind == "onnxruntime" and spec.providers == "auto"
    assert spec.batching.max_batch == 8 and spec.batching.enabled


def test_session_options_reach_onnx_runtime(tmp_path: Path) -> None:
    """`session.allow_spinning: false` (a sidecar sharing its cores) is what ORT runs with."""
    from backends.local.onnx import OrtEngine
    from backends.settings import SessionOptions
    from tests.local.test_tensor_model import channel_means_model

    path = tmp_path / "means.onnx"
    channel_means_model(path)
    for spin, want in ((False, "0"), (True, "1")):
        opts = SessionOptions(intra_op_threads=1, allow_spinning=spin)
        eng = OrtEngine(str(path), "means", ["CPUExecutionProvider"], opts)
        got = eng._sess.get_session_options()
        assert got.get_session_config_entry("session.intra_op.allow_spinning") == want
        assert got.intra_op_num_threads == 1
        eng.close()
