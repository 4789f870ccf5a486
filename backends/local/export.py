"""Export a transformers encoder to ONNX (token embeddings out). A child process: imports torch.

python -m backends.local.export MODEL_DIR OUT.onnx
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

INPUTS = ["input_ids", "attention_mask", "token_type_ids"]
OUTPUT = "token_embeddings"


def export_encoder(model_dir: Path, out: Path, opset: int = 17) -> None:
    import torch
    from transformers import AutoModel

    # Eager attention traces to the classic MatMul/Softmax pattern, which ONNX Runtime's
    # optimizer fuses (backends/local/fuse.py); SDPA traces to an IsNaN/Where graph it cannot.
    model = AutoModel.from_pretrained(
        str(model_dir), local_files_only=True, attn_implementation="eager"
    )
    model.eval()

    class Encoder(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(
            self,
            input_ids: torch.Tensor,
            attention_mask: torch.Tensor,
            token_type_ids: torch.Tensor,
        ) -> torch.Tensor:
            out = self.inner(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            )
            return out[0]  # type: ignore[no-any-return]

    export_text_model(Encoder(model), out, OUTPUT, {0: "batch", 1: "tokens"}, opset)


def export_text_model(
    module: Any, out: Path, output: str, output_axes: dict[int, str], opset: int = 17
) -> None:
    """Trace a module taking (input_ids, attention_mask, token_type_ids), batch and token axes
    dynamic, into ONNX (the legacy exporter: its graphs load on every ONNX Runtime here)."""
    import torch

    dummy = torch.ones((2, 8), dtype=torch.int64)
    dynamic = {n: {0: "batch", 1: "tokens"} for n in INPUTS} | {output: output_axes}
    with torch.no_grad():
        torch.onnx.export(
            module,
            (dummy, dummy, torch.zeros_like(dummy)),
            str(out),
            input_names=INPUTS,
            output_names=[output],
            dynamic_axes=dynamic,
            opset_version=opset,
            dynamo=False,
        )


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    from backends.local.export_runner import die_with_parent

    die_with_parent()
    export_encoder(Path(argv[0]), Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
