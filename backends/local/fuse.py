"""Fuse a BERT-style encoder's ONNX graph for ONNX Runtime: a child process (imports `onnx`).

python -m backends.local.fuse IN.onnx CONFIG.json OUT.onnx

CONFIG.json is the transformers config of the weights (attention heads and hidden size).

ONNX Runtime's transformer optimizer folds each layer's attention subgraph (a few dozen
MatMul/Reshape/Transpose/Softmax nodes) into one `com.microsoft.Attention` kernel, the residual
adds into SkipLayerNormalization and the embeddings into EmbedLayerNormalization. On the
packaged MiniLM that took ~10 % off a semantic hit on a 2-core CPU at 2 threads (0-16 % off
the embed across paired runs; nothing at 1 thread: docs/benchmarks.md). The fused file
holds ONNX Runtime contrib ops, so it is served by ONNX Runtime (CPU or CUDA) only: TensorRT and
`latentgate build` keep using the portable export beside it.

The fused graph is written only when attention actually fused and its outputs match the
portable graph's on padded batches; otherwise this exits 3 (NOT_APPLICABLE: the caller serves
the original and does not try again) and on any other failure 1 (tried again at the next start).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NoReturn

import numpy as np

from backends.local.export_runner import NOT_APPLICABLE, die_with_parent

# Outputs are token embeddings of magnitude ~1; fusion reorders float sums, nothing more.
MAX_ABS_DIFF = 1e-3


def fuse(src: Path, config: Path, out: Path) -> dict[str, int]:
    from onnxruntime.transformers import optimizer

    cfg = json.loads(config.read_text(encoding="utf-8"))
    model = optimizer.optimize_model(
        str(src),
        model_type="bert",
        num_heads=int(cfg["num_attention_heads"]),
        hidden_size=int(cfg["hidden_size"]),
    )
    stats = {k: int(v) for k, v in model.get_fused_operator_statistics().items() if v}
    if not stats.get("Attention") and not stats.get("MultiHeadAttention"):
        _not_applicable(f"no attention fused ({stats}): serving the portable graph")
    model.save_model_to_file(str(out))
    diff = max_abs_diff(src, out)
    if diff > MAX_ABS_DIFF:
        out.unlink()
        _not_applicable(f"fused graph differs from the original by {diff:.2e}")
    print(f"fused {stats}; max |diff| {diff:.2e}")
    return stats


def _not_applicable(why: str) -> NoReturn:
    print(why, file=sys.stderr)
    raise SystemExit(NOT_APPLICABLE)


def max_abs_diff(a: Path, b: Path) -> float:
    """Both graphs on batches with padding (the attention mask must survive fusion)."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    worst = 0.0
    sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (a, b)]
    names = {i.name for i in sessions[0].get_inputs()}
    for batch, width in ((1, 7), (3, 19)):
        ids = rng.integers(1000, 20000, (batch, width)).astype(np.int64)
        mask = np.ones_like(ids)
        mask[1:, width // 2 :] = 0  # rows after the first are padded
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        feeds = {k: v for k, v in feeds.items() if k in names}
        ref, got = (s.run(None, feeds)[0] for s in sessions)
        if ref.ndim == 3:  # token outputs: padded positions are never pooled
            real = mask.astype(bool)
            ref, got = ref[real], got[real]
        worst = max(worst, float(np.abs(ref - got).max()))
    return worst


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    die_with_parent()
    fuse(Path(argv[0]), Path(argv[1]), Path(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
