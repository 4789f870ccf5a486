"""TextEncoder on ONNX Runtime (CPU): agrees with sentence-transformers; batched equals alone."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from backends.errors import BadInput
from backends.local.text_encoder import TextEncoder, load_text_encoder
from backends.settings import BatcherSettings
from tests.local.conftest import SENTENCES, artifacts_dir, st_encode


def test_encode_matches_sentence_transformers(encoder: TextEncoder, reference: Any) -> None:
    ours = encoder.encode(SENTENCES)
    theirs = st_encode(reference, SENTENCES)
    assert ours.shape == (len(SENTENCES), 384) and ours.dtype == np.float32
    cos = (ours * theirs).sum(axis=1)
    assert cos.min() >= 0.999, cos
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_describes_where_it_runs(encoder: TextEncoder) -> None:
    assert encoder.name == "all-MiniLM-L6-v2"
    assert encoder.dim == 384
    assert encoder.device == "cpu"
    assert encoder.providers == ["CPUExecutionProvider"]
    assert encoder.ready


def test_batched_equals_one_at_a_time(encoder: TextEncoder) -> None:
    together = encoder.encode(SENTENCES)
    alone = np.stack([encoder.encode([s])[0] for s in SENTENCES])
    assert np.abs(together - alone).max() < 1e-5


async def test_aencode_concurrent_callers_get_their_own_rows(encoder: TextEncoder) -> None:
    expected = encoder.encode(SENTENCES)
    jobs = [encoder.aencode([SENTENCES[i % len(SENTENCES)]]) for i in range(24)]
    out = await asyncio.gather(*jobs)
    for i, rows in enumerate(out):
        assert rows.shape == (1, 384)
        assert np.abs(rows[0] - expected[i % len(SENTENCES)]).max() < 1e-5


def test_long_input_is_truncated_like_sentence_transformers(
    encoder: TextEncoder, reference: Any
) -> None:
    text = "word " * 400
    cos = float((encoder.encode([text]) * st_encode(reference, [text])).sum())
    assert cos >= 0.999


def test_serving_encoder_refuses_too_many_tokens_by_name() -> None:
    enc = load_text_encoder(
        providers=["CPUExecutionProvider"],
        artifacts_dir=artifacts_dir(),
        truncate=False,
        max_tokens=32,
        warmup=False,
    )
    with pytest.raises(BadInput, match=r"input\[1\] has \d+ tokens; this model takes at most 32"):
        enc.encode(["short", "long " * 50])


def test_empty_list_gives_an_empty_matrix(encoder: TextEncoder) -> None:
    assert encoder.encode([]).shape == (0, 384)


def test_metrics_name_the_device() -> None:
    reg = CollectorRegistry()
    enc = load_text_encoder(
        providers="auto",
        artifacts_dir=artifacts_dir(),
        registry=reg,
        batching=BatcherSettings(max_delay_ms=1),
        warmup=False,
    )
    labels = {
        "model": "all-MiniLM-L6-v2",
        "engine": "onnxruntime",
        "device": enc.device,
        "provider": enc.providers[0],
    }
    assert reg.get_sample_value("latentgate_engine_info", labels) == 1.0


def test_serving_path_does_not_import_torch(tmp_path: Any) -> None:
    """The artifact exists (session fixture), so loading and encoding must not pull in torch."""
    import subprocess

    code = (
        "import sys; from backends.local.text_encoder import load_text_encoder as l; "
        f"e = l(artifacts_dir={artifacts_dir()!r}); e.encode(['x']); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
