"""Local backend settings: validated like every other config section, errors with path and line."""

from __future__ import annotations

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
