"""`latentgate build` on a text classifier: top-1 agreement against FP32, promotion and refusal.

The model is a tiny real ONNX classifier exported here with torch: mean of token embeddings
(ids from the packaged MiniLM tokenizer) → linear → tanh → linear → 8 logits. Embedding column 0
is an activation outlier (a constant 200) that the classifier ignores (zero weights) but that sets
the range of INT8's per-tensor quantisation, so INT8 rounds the informative features away and
flips classes, while FP16 (relative precision per value) keeps them.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

from backends.errors import EngineError
from backends.local.artifacts import builtin_dir, resolve
from backends.local.build import run_build
from backends.local.build_classifier import detect_task
from backends.local.engine import TensorSpec
from gateway.cli import main
from tests.local.test_tensor_model import channel_means_model

CLASSES = 8


def export_classifier(out: Path) -> None:
    import torch

    torch.manual_seed(0)

    class Classifier(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(30522, 16)
            self.hidden = torch.nn.Linear(16, 32)
            self.head = torch.nn.Linear(32, CLASSES)
            with torch.no_grad():
                self.emb.weight[:, 0] = 200.0  # the outlier channel
                self.hidden.weight[:, 0] = 0.0  # carries no signal

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            mask = attention_mask.unsqueeze(-1).to(torch.float32)
            mean = (self.emb(input_ids) * mask).sum(1) / mask.sum(1).clamp(min=1.0)
            return self.head(torch.tanh(self.hidden(mean)))  # type: ignore[no-any-return]

    ids = torch.ones((2, 8), dtype=torch.int64)
    axes = {"input_ids": {0: "batch", 1: "tokens"}, "attention_mask": {0: "batch", 1: "tokens"},
            "logits": {0: "batch"}}  # fmt: skip
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation notice
        torch.onnx.export(Classifier().eval(), (ids, ids), str(out), dynamo=False, opset_version=17,
                          input_names=["input_ids", "attention_mask"], output_names=["logits"],
                          dynamic_axes=axes)  # fmt: skip


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("classifier") / "clf.onnx"
    export_classifier(out)
    return out


@pytest.fixture
def clf(exported: Path, tmp_path: Path) -> Path:
    """A fresh copy per test: builds write their artifacts and reports beside the model."""
    return Path(shutil.copy(exported, tmp_path / "clf.onnx"))


@pytest.fixture
def validation(tmp_path: Path) -> str:
    subjects = ["A man", "The woman", "Two children", "A small dog", "The committee", "A pilot"]
    verbs = ["is playing", "reads", "talks about", "walks past", "watches"]
    objects = ["a guitar.", "the newspaper.", "the weather in Paris.", "stock prices."]
    path = tmp_path / "validation.txt"
    path.write_text("\n".join(f"{s} {v} {o}" for s in subjects for v in verbs for o in objects))
    return str(path)


TOKENIZER = str(builtin_dir("all-MiniLM-L6-v2") / "tokenizer.json")


def test_fp16_classifier_is_promoted_with_top1_agreement(clf: Path, validation: str) -> None:
    out: list[str] = []
    code = run_build(str(clf), "fp16", validation=validation, tokenizer=TOKENIZER,
                     emit=out.append)  # fmt: skip
    report = "\n".join(out)
    assert code == 0, report
    assert "accuracy report: clf fp16 vs fp32 (classifier) on 120 validation sentences" in report
    assert f"classes: {CLASSES} (output 'logits')" in report
    assert "top-1 agree" in report and "flipped" in report
    fp16_row = next(line for line in out if line.strip().startswith("fp16 "))
    assert fp16_row.split()[4:6] == ["1.0000", "0"], fp16_row
    assert f"promoted: {clf.with_name('clf.fp16.onnx')} (top-1 agreement 1.0000 ≥ 0.99)" in report
    record = json.loads(clf.with_name("clf.report.fp16.json").read_text())
    assert record["task"] == "classifier" and record["top1_agreement"] == 1.0
    assert record["bound"] == 0.99 and record["validation"] == 120
    # The promoted artifact is what `precision: fp16` now serves for this model file.
    assert resolve(str(clf), None, TOKENIZER, "fp16").onnx_path == clf.with_name("clf.fp16.onnx")


def test_a_build_is_not_served_once_its_model_file_is_replaced(clf: Path, validation: str) -> None:
    assert run_build(str(clf), "fp16", validation=validation, tokenizer=TOKENIZER,
                     emit=lambda _: None) == 0  # fmt: skip
    channel_means_model(clf)  # another model now under the same name (a retrained one, say)
    with pytest.raises(EngineError, match=r"clf\.fp16\.onnx was built from another model"):
        resolve(str(clf), None, TOKENIZER, "fp16")
    assert resolve(str(clf), None, TOKENIZER, "fp32").onnx_path == clf


def test_cli_refuses_an_int8_classifier_that_flips_classes(
    clf: Path, validation: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["build", str(clf), "--precision", "int8", "--tokenizer", TOKENIZER,
                 "--validation", validation])  # fmt: skip
    report = capsys.readouterr().out
    assert code == 1, report
    assert "accuracy report: clf int8 vs fp32 (classifier)" in report
    assert "REFUSED: top-1 agreement 0." in report and "below the bound 0.99" in report
    record = json.loads(clf.with_name("clf.report.int8.json").read_text())
    assert record["top1_agreement"] < 0.99 and record["flipped"] > 1
    assert not clf.with_name("clf.int8.onnx").exists()
    with pytest.raises(EngineError, match="no promoted int8 artifact"):
        resolve(str(clf), None, TOKENIZER, "int8")


def test_a_lower_bound_lets_the_same_int8_build_through(clf: Path, validation: str) -> None:
    out: list[str] = []
    code = run_build(str(clf), "int8", validation=validation, tokenizer=TOKENIZER,
                     min_agreement=0.0, emit=out.append)  # fmt: skip
    assert code == 0 and clf.with_name("clf.int8.onnx").exists(), "\n".join(out)


def test_an_onnx_file_without_a_tokenizer_is_refused_by_name(clf: Path, validation: str) -> None:
    out: list[str] = []
    assert run_build(str(clf), "fp16", validation=validation, emit=out.append) == 1
    assert out == [f"build failed: model {clf} needs its tokenizer.json: pass --tokenizer FILE"]


def test_forcing_the_embedder_task_on_a_classifier_names_the_missing_output(
    clf: Path, validation: str
) -> None:
    out: list[str] = []
    code = run_build(str(clf), "fp32", validation=validation, tokenizer=TOKENIZER,
                     task="embedder", emit=out.append)  # fmt: skip
    assert code == 1 and out == ["build failed: model clf has no output 'token_embeddings'"]


def test_task_detection_from_outputs() -> None:
    tokens = TensorSpec("token_embeddings", "FP32", (-1, -1, 384))
    logits = TensorSpec("logits", "FP32", (-1, 3))
    ids = TensorSpec("label", "INT64", (-1,))
    assert detect_task([tokens], "auto", "m") == ("embedder", "token_embeddings")
    assert detect_task([ids, logits], "auto", "m") == ("classifier", "logits")
    assert detect_task([tokens, logits], "classifier", "m") == ("classifier", "logits")
    with pytest.raises(EngineError, match=r"cannot tell whether m .* pass --task"):
        detect_task([ids], "auto", "m")
    with pytest.raises(EngineError, match=r"m has no 2-D float output \(batch, classes\)"):
        detect_task([tokens], "classifier", "m")
