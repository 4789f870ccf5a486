"""Export the cross-encoder to ONNX. A child process: imports torch.

python -m cache.semantic.cross_encoder_export BASE_MODEL_DIR ARTIFACT.npz OUT.onnx
"""

from __future__ import annotations

import sys
from pathlib import Path

OUTPUT = "probability"


def export(base: Path, artifact: Path, out: Path, opset: int = 17) -> None:
    import torch
    from transformers import AutoModel

    from backends.local import export_text_model
    from cache.semantic.cross_encoder import load_artifact

    weights, meta, _ = load_artifact(artifact)
    layers = int(meta["layers"])
    bert = AutoModel.from_pretrained(
        str(base),
        num_hidden_layers=layers,
        add_pooling_layer=False,
        local_files_only=True,
        attn_implementation="eager",  # fusable by ONNX Runtime (backends/local/fuse.py)
    )
    enc = "encoder."
    state = {k[len(enc) :]: torch.from_numpy(v) for k, v in weights.items() if k.startswith(enc)}
    bert.encoder.load_state_dict(state, strict=True)
    head = torch.nn.Linear(bert.config.hidden_size, 1)
    head.weight.data = torch.from_numpy(weights["head.weight"]).reshape(1, -1)
    head.bias.data = torch.from_numpy(weights["head.bias"]).reshape(1)
    bert.eval()

    class PairScorer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert
            self.head = head

        def forward(
            self,
            input_ids: torch.Tensor,
            attention_mask: torch.Tensor,
            token_type_ids: torch.Tensor,
        ) -> torch.Tensor:
            hid = self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            )[0]
            m = attention_mask.unsqueeze(-1).to(hid.dtype)
            pooled = (hid * m).sum(1) / m.sum(1).clamp(min=1.0)
            return torch.sigmoid(self.head(pooled)).squeeze(1)

    export_text_model(PairScorer(), out, OUTPUT, {0: "batch"}, opset)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    from backends.local import die_with_parent

    die_with_parent()
    export(Path(argv[0]), Path(argv[1]), Path(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
