"""Build the ONNX artifacts of the packaged all-MiniLM-L6-v2 (the embedder, and the semantic
cache's cross-encoder when one was trained) into an artifacts directory, exactly
where the serving side's `backends.local.artifacts.resolve` looks for it (named by weight hash),
and check it against sentence-transformers before an image ships it.

Runs in the images' build stage, where torch is installed; the serving stage copies the directory
and sets LATENTGATE_ARTIFACTS to it, so it never exports (and never imports torch).
usage: python scripts/export_minilm.py ARTIFACTS_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

MODEL = "builtin:all-MiniLM-L6-v2"


def build(artifacts: Path) -> Path:
    import numpy as np
    import onnxruntime as ort
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    from backends.local.artifacts import resolve

    art = resolve(MODEL, str(artifacts))  # exports once (a child process with torch)
    assert art.tokenizer_path is not None and art.source_dir is not None
    text = "the gateway answers from its cache"
    enc = Tokenizer.from_file(str(art.tokenizer_path)).encode(text)
    feeds = {
        "input_ids": np.array([enc.ids], np.int64),
        "attention_mask": np.array([enc.attention_mask], np.int64),
        "token_type_ids": np.array([enc.type_ids], np.int64),
    }
    session = ort.InferenceSession(str(art.onnx_path), providers=["CPUExecutionProvider"])
    tokens = session.run(None, feeds)[0]
    mask = feeds["attention_mask"][..., None].astype(np.float32)
    mean = (tokens * mask).sum(1) / mask.sum(1)
    mean /= np.linalg.norm(mean, axis=1, keepdims=True)
    ref = SentenceTransformer(str(art.source_dir), device="cpu").encode(
        [text], normalize_embeddings=True
    )
    cosine = float((mean * ref).sum())
    if cosine < 0.9999:
        raise SystemExit(f"exported model disagrees with sentence-transformers: cosine {cosine}")
    print(f"{art.onnx_path}")
    print(f"cosine to sentence-transformers: {cosine:.6f}")
    # A trained cross-encoder verifier, when there is one: rebuilt from the packaged weights
    # plus its artifact, exported here so the serving image never needs torch.
    from cache.semantic.cross_encoder import DEFAULT_ARTIFACT, build_onnx

    if DEFAULT_ARTIFACT.is_file():
        print(build_onnx(DEFAULT_ARTIFACT, artifacts))
    return art.onnx_path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: export_minilm.py ARTIFACTS_DIR")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    build(Path(sys.argv[1]))
