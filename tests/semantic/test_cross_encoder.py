"""The cross-encoder verifier's plumbing: int8 storage round-trips, the ONNX export matches
torch, a new operating point does not force a rebuild, and the verifier applies its floor, bar
and per-entry tightening (the stage runs it in a worker thread: test_gateway.py). No trained
artifact ships (docs/benchmarks.md): these use the packaged MiniLM's first layer and a random
head."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from cache.semantic.cross_encoder import (
    CrossEncoder,
    build_onnx,
    load_artifact,
    read_meta,
    save_artifact,
    update_meta,
)
from cache.semantic.features import text_info
from cache.semantic.verifier import CrossEncoderVerifier, Decision

PAIRS = [
    ("How do I reset my password?", "How can I reset my password?"),
    ("What is 2+3?", "What is 2+4?"),
    ("Is the Tabaci a tributary of the Leurda?", "Is the Leurda a tributary of the Tabaci?"),
]


def test_int8_rows_round_trip_within_half_a_step(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    w = {"encoder.m": rng.normal(0, 0.05, (8, 16)).astype(np.float32), "head.bias": np.ones(1)}
    save_artifact(tmp_path / "a.npz", w, {"layers": 1})
    back, meta, _ = load_artifact(tmp_path / "a.npz")
    step = np.abs(w["encoder.m"]).max(axis=1, keepdims=True) / 127
    assert np.all(np.abs(back["encoder.m"] - w["encoder.m"]) <= step / 2 + 1e-7)
    assert back["head.bias"].tolist() == [1.0] and meta == {"layers": 1}


def test_new_operating_point_keeps_the_built_model(tmp_path: Path, ce_artifact: Path) -> None:
    art = tmp_path / "ce.npz"
    shutil.copy(ce_artifact, art)
    first = build_onnx(art, tmp_path / "artifacts")
    meta = read_meta(art)
    update_meta(art, {**meta, "p_min": 0.123})
    assert read_meta(art)["p_min"] == 0.123
    assert build_onnx(art, tmp_path / "artifacts") == first  # same weights hash: no re-export


def test_onnx_scores_equal_the_torch_model(cross_encoder: CrossEncoder, ce_artifact: Path) -> None:
    torch = pytest.importorskip("torch")
    from tokenizers import Tokenizer
    from transformers import AutoModel

    from backends.local.artifacts import builtin_dir

    weights, meta, _ = load_artifact(ce_artifact)
    base = builtin_dir("all-MiniLM-L6-v2")
    bert = AutoModel.from_pretrained(
        str(base), num_hidden_layers=int(meta["layers"]), add_pooling_layer=False
    ).eval()
    state = {k[8:]: torch.from_numpy(v) for k, v in weights.items() if k.startswith("encoder.")}
    bert.encoder.load_state_dict(state, strict=True)
    tok = Tokenizer.from_file(str(base / "tokenizer.json"))
    tok.no_padding()
    want = []
    with torch.no_grad():
        for q, c in PAIRS:
            e = tok.encode(q, c)
            hid = bert(
                input_ids=torch.tensor([e.ids]), token_type_ids=torch.tensor([e.type_ids])
            ).last_hidden_state[0]
            logit = hid.mean(0).numpy() @ weights["head.weight"].reshape(-1) + weights["head.bias"]
            want.append(float(1 / (1 + np.exp(-logit[0]))))
    got = cross_encoder.score_pairs_sync([q for q, _ in PAIRS], [c for _, c in PAIRS])
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_batched_scores_equal_one_by_one(cross_encoder: CrossEncoder) -> None:
    # Padding inside a batch must not change a pair's score.
    batch = cross_encoder.score_pairs_sync([q for q, _ in PAIRS], [c for _, c in PAIRS])
    alone = [cross_encoder.score_pairs_sync([q], [c])[0] for q, c in PAIRS]
    np.testing.assert_allclose(batch, alone, atol=1e-5)


def _verify(ver: CrossEncoderVerifier, q: str, cands: list[str], cos: list[float], bars=()):  # type: ignore[no-untyped-def]
    vec = np.zeros((len(cands), 384), np.float32)
    return ver.choose(
        text_info(q), vec[0], [text_info(c) for c in cands], vec, np.asarray(cos), bars
    )


def test_verifier_scores_only_candidates_over_the_floor(cross_encoder: CrossEncoder) -> None:
    q, (c1, c2) = PAIRS[0][0], (PAIRS[0][1], PAIRS[1][1])
    p1, p2 = cross_encoder.score_pairs_sync([q, q], [c1, c2])
    ver = CrossEncoderVerifier(cross_encoder.artifact, floor=0.8, p_min=0.0)
    ver.attach(cross_encoder)
    # Below the floor nothing is scored: a miss with nothing refused.
    assert _verify(ver, q, [c1, c2], [0.7, 0.6]) == Decision(-1, 0.0, 0)
    # Over it, the most probable candidate is served, the other counts as refused.
    got = _verify(ver, q, [c1, c2], [0.95, 0.9])
    assert got.index == (0 if p1 >= p2 else 1) and got.refused == 1
    assert got.score == pytest.approx(max(p1, p2), abs=1e-6)


def test_verifier_bar_and_per_entry_tightening(cross_encoder: CrossEncoder) -> None:
    q, c = PAIRS[0]
    p = float(cross_encoder.score_pairs_sync([q], [c])[0])
    ver = CrossEncoderVerifier(cross_encoder.artifact, floor=0.5, p_min=p - 1e-3)
    ver.attach(cross_encoder)
    assert _verify(ver, q, [c], [0.9]).index == 0
    assert _verify(ver, q, [c], [0.9], (p + 0.01,)).index == -1  # that entry's raised bar
    strict = CrossEncoderVerifier(cross_encoder.artifact, floor=0.5, p_min=p + 1e-3)
    strict.attach(cross_encoder)
    assert _verify(strict, q, [c], [0.9]) == Decision(-1, pytest.approx(p, abs=1e-6), 1)


def test_operating_point_comes_from_the_artifact(ce_artifact: Path) -> None:
    ver = CrossEncoderVerifier(ce_artifact, None, None)
    assert (ver.floor, ver.p_min) == (0.8, 0.5)
    # Not attached yet (the model loads at start-up): candidates are refused, never served.
    assert _verify(ver, "a question here", ["a question there"], [0.99]).index == -1
