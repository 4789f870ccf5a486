"""TensorRT: a clear refusal where it cannot run (CI), engine tests wherever `tensorrt` imports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from backends import EngineError, build_backends
from backends.local.tensorrt import unavailable_reason
from backends.settings import TensorRTBackendSettings
from gateway.cli import main
from tests.local.conftest import SENTENCES, artifacts_dir

REASON = unavailable_reason()
needs_trt = pytest.mark.skipif(REASON is not None, reason=f"TensorRT cannot run here: {REASON}")


def _config(tmp_path: Path) -> str:
    cfg = {
        "backends": {"trt": {"kind": "tensorrt", "model": "builtin:all-MiniLM-L6-v2"}},
        "routes": [{"name": "all", "match": {"prefix": "/"}, "backend": "trt"}],
    }
    path = tmp_path / "trt.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


@pytest.mark.skipif(
    REASON is None, reason="tensorrt runs here; the refusal is for machines without"
)
def test_check_config_says_tensorrt_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check-config", _config(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "backend 'trt': kind tensorrt needs the NVIDIA `tensorrt` Python package" in err
    assert "use kind: onnxruntime" in err


@pytest.mark.skipif(
    REASON is None, reason="tensorrt runs here; the refusal is for machines without"
)
def test_serve_refuses_at_start_with_the_same_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--config", _config(tmp_path), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "refusing to start: backend 'trt': kind tensorrt needs" in err
    spec = TensorRTBackendSettings(model="builtin:all-MiniLM-L6-v2")
    with pytest.raises(EngineError, match="kind tensorrt needs"):
        build_backends({"trt": spec})


@needs_trt
@pytest.mark.gpu
def test_trt_fp16_engine_matches_onnxruntime(encoder: Any) -> None:
    from backends.local.text_encoder import load_text_encoder

    trt = load_text_encoder(engine="tensorrt", precision="fp16", artifacts_dir=artifacts_dir())
    cos = (trt.encode(SENTENCES) * encoder.encode(SENTENCES)).sum(axis=1)
    assert trt.device == "cuda" and cos.min() >= 0.999


@needs_trt
@pytest.mark.gpu
def test_trt_engine_cache_is_keyed_by_gpu_and_version() -> None:
    import tensorrt
    import torch

    from backends.local.artifacts import resolve
    from backends.local.tensorrt import engine_cache_path

    art = resolve("builtin:all-MiniLM-L6-v2", artifacts_dir())
    path = engine_cache_path(art, artifacts_dir(), torch.cuda.get_device_name(),
                             tensorrt.__version__, "fp16", 64, 256)  # fmt: skip
    assert tensorrt.__version__ in path.name and art.model_hash[:16] in str(path)
    assert np.all([path.suffix == ".plan"])


def test_a_batch_narrower_than_the_profile_reaches_tensorrt_row_by_row() -> None:
    """TensorRT reads an input densely from its address; a batch of 2 rows of 3 tokens staged in
    a buffer of 4 x 8 must be those 6 values in order (the device does not matter: CPU torch)."""
    torch = pytest.importorskip("torch")
    from backends.local.tensorrt import dense_prefix

    buf = torch.full((4, 8), -1, dtype=torch.int64)  # what an earlier, longer batch left
    src = torch.tensor([[101, 7, 102], [101, 9, 102]])
    view = dense_prefix(buf, tuple(src.shape))
    view.copy_(src)
    assert view.data_ptr() == buf.data_ptr()  # the address TensorRT is given
    assert buf.view(-1)[:6].tolist() == [101, 7, 102, 101, 9, 102]  # what it reads there
