"""The cross-encoder verifier's model: artifact on disk, ONNX build, and pair scoring.

The artifact (`cross_encoder.npz`, trained by bench/train_cross_encoder.py) holds only what
training changed: the bottom transformer layers of the packaged all-MiniLM-L6-v2 (2-D weights
as int8 with a float32 scale per row, the rest float32) and a one-unit head. The word, position
and type embeddings are the packaged model's own, so an artifact is 5-10 MB, not 90.

At start-up the model is rebuilt from the packaged weights plus the artifact and exported to
ONNX once, in a child process (torch stays out of the serving process), cached under the
artifacts directory keyed by the hash of both. Scoring a (question, cached question) pair runs
ONNX Runtime on the tokenised pair and returns the probability that they ask the same thing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from backends import SessionOptions
from backends.local import (
    EXPORT_REV,
    builtin_dir,
    default_artifacts_dir,
    file_hash,
    fused,
    run_export,
    usable,
)

log = logging.getLogger("latentgate.semantic")

DEFAULT_ARTIFACT = Path(__file__).with_name("cross_encoder.npz")
BASE_MODEL = "all-MiniLM-L6-v2"
_Q, _S = "::q", "::s"


def save_artifact(path: Path, weights: dict[str, NDArray[Any]], meta: dict[str, Any]) -> None:
    """2-D weights → int8 per row (symmetric); vectors stay float32."""
    arrays: dict[str, Any] = {"meta": np.asarray(json.dumps(meta))}
    for name, w in weights.items():
        w = np.asarray(w, dtype=np.float32)
        if w.ndim == 2:
            scale = np.maximum(np.abs(w).max(axis=1), 1e-12) / 127.0
            arrays[name + _Q] = np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8)
            arrays[name + _S] = scale.astype(np.float32)
        else:
            arrays[name] = w
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)


def load_artifact(path: Path) -> tuple[dict[str, NDArray[np.float32]], dict[str, Any], str]:
    """(dequantised weights, meta, a hash of the weights alone: meta edits keep the ONNX)."""
    weights: dict[str, NDArray[np.float32]] = {}
    h = hashlib.blake2b(digest_size=16)
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        for key in sorted(z.files):
            if key == "meta" or key.endswith(_S):
                continue
            arr = z[key]
            h.update(key.encode())
            h.update(arr.tobytes())
            if key.endswith(_Q):
                name = key[: -len(_Q)]
                scale = z[name + _S]
                h.update(scale.tobytes())
                weights[name] = arr.astype(np.float32) * scale[:, None]
            else:
                weights[key] = arr.astype(np.float32)
    return weights, meta, h.hexdigest()


def read_meta(path: Path) -> dict[str, Any]:
    with np.load(path, allow_pickle=False) as z:
        meta: dict[str, Any] = json.loads(str(z["meta"]))
    return meta


def update_meta(path: Path, meta: dict[str, Any]) -> None:
    """Rewrite the artifact's meta (the operating point) without touching the weights."""
    with np.load(path, allow_pickle=False) as z:
        arrays: dict[str, Any] = {k: z[k] for k in z.files if k != "meta"}
    arrays["meta"] = np.asarray(json.dumps(meta))
    np.savez_compressed(path, **arrays)


def build_onnx(artifact: Path, artifacts_dir: Path) -> Path:
    """The exported model for this artifact and the packaged weights (built once, file-locked)."""
    base = builtin_dir(BASE_MODEL)
    _, meta, weights_hash = load_artifact(artifact)
    key = hashlib.blake2b(
        f"{weights_hash}{file_hash(base / 'model.safetensors')}-e{EXPORT_REV}".encode(),
        digest_size=12,
    ).hexdigest()
    out = artifacts_dir / "cross-encoder" / key / "model.onnx"
    if usable(out, key):
        return out
    log.info("building the cross-encoder ONNX model (once; cached at %s)", out)
    t0 = time.perf_counter()
    args = ["cache.semantic.cross_encoder_export", str(base), str(artifact)]
    if run_export(args, out, "cross-encoder export", source=key):
        took = time.perf_counter() - t0
        log.info("cross-encoder (%s layers) exported in %.1f s", meta.get("layers"), took)
    return out


class CrossEncoder:
    """Scores (question, cached question) pairs; thread-safe (ORT sessions are)."""

    def __init__(
        self,
        artifact: Path,
        artifacts_dir: Path,
        providers: str | list[str] = "auto",
        threads: int = 1,
    ) -> None:
        from tokenizers import Tokenizer

        from backends.local import OrtEngine

        self.artifact = artifact
        _, self.meta, _ = load_artifact(artifact)
        self.max_tokens = int(self.meta.get("max_tokens", 64))
        onnx_path = build_onnx(artifact, artifacts_dir)
        self.engine = OrtEngine(
            str(fused(onnx_path, builtin_dir(BASE_MODEL) / "config.json") or onnx_path),
            "cross-encoder",
            providers,
            SessionOptions(intra_op_threads=threads),
        )
        self.device = self.engine.device
        self._tok = Tokenizer.from_file(str(builtin_dir(BASE_MODEL) / "tokenizer.json"))
        self._tok.enable_truncation(self.max_tokens)
        self._tok.no_padding()

    @classmethod
    def load(
        cls,
        path: str | Path | None = None,
        *,
        artifacts_dir: str | None = None,
        providers: str | list[str] = "auto",
        threads: int = 1,
    ) -> CrossEncoder:
        return cls(
            Path(path) if path else DEFAULT_ARTIFACT,
            default_artifacts_dir(artifacts_dir),
            providers,
            threads,
        )

    @property
    def weights(self) -> dict[str, NDArray[np.float32]]:
        return load_artifact(self.artifact)[0]

    def score_pairs_sync(self, queries: Sequence[str], cands: Sequence[str]) -> NDArray[np.float32]:
        """P(same question) per pair, one ORT run per call."""
        if not queries:
            return np.zeros(0, np.float32)
        enc = self._tok.encode_batch(list(zip(queries, cands, strict=True)))
        width = max(len(e.ids) for e in enc)
        ids = np.zeros((len(enc), width), np.int64)
        typ = np.zeros_like(ids)
        mask = np.zeros_like(ids)
        for r, e in enumerate(enc):
            n = len(e.ids)
            ids[r, :n] = e.ids
            typ[r, :n] = e.type_ids
            mask[r, :n] = 1
        out = self.engine.run({"input_ids": ids, "attention_mask": mask, "token_type_ids": typ})
        return np.asarray(out["probability"], dtype=np.float32).reshape(-1)

    def warmup(self) -> float:
        t0 = time.perf_counter()
        for n in (1, 3):
            self.score_pairs_sync(["how do I warm up?"] * n, ["how do I warm up a model?"] * n)
        return time.perf_counter() - t0

    def close(self) -> None:
        self.engine.close()
