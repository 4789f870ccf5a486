"""`latentgate build`: accuracy report against FP32 and refusal over the bound."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.local.build import read_sentences, run_build
from backends.local.build_classifier import top1_agreement
from gateway.cli import main
from tests.local.conftest import SENTENCES, artifacts_dir


@pytest.fixture
def validation(tmp_path: Path) -> str:
    words = ["cats", "the weather", "a guitar", "stock prices", "football", "rain in Paris"]
    lines = [f"{s} {w}" for s in SENTENCES[:5] for w in words]
    path = tmp_path / "validation.txt"
    path.write_text("\n".join(lines))
    return str(path)


def test_int8_dynamic_is_refused_at_a_0999_bar(validation: str, encoder: object) -> None:
    out: list[str] = []
    code = run_build("builtin:all-MiniLM-L6-v2", "int8", validation=validation,
                     artifacts_dir=artifacts_dir(), emit=out.append)  # fmt: skip
    report = "\n".join(out)
    assert code == 1, report
    assert (
        "accuracy report: all-MiniLM-L6-v2 int8 vs fp32 (embedder) on 30 validation sentences"
        in report
    )
    assert "REFUSED: mean cosine 0.9" in report and "not promoted" in report


def test_fp32_build_is_promoted_with_a_report(validation: str, encoder: object) -> None:
    out: list[str] = []
    code = run_build("builtin:all-MiniLM-L6-v2", "fp32", validation=validation,
                     artifacts_dir=artifacts_dir(), emit=out.append)  # fmt: skip
    assert code == 0 and any(line.startswith("promoted:") for line in out)


def test_cli_build_names_a_missing_validation_file(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["build", "builtin:all-MiniLM-L6-v2", "--validation", "/nonexistent/v.txt"])
    assert code == 1
    assert "/nonexistent/v.txt does not exist" in capsys.readouterr().out


def test_read_sentences_takes_both_stsb_columns(tmp_path: Path) -> None:
    path = tmp_path / "sts.csv"
    path.write_text(
        "g\tf\ty\t1\t4.0\tA man sings.\tA man is singing.\ng\tf\ty\t2\t1.0\tA b.\tC d.\n"
    )
    assert read_sentences(str(path)) == ["A man sings.", "A man is singing.", "A b.", "C d."]


def test_top1_agreement_counts_unchanged_classes() -> None:
    import numpy as np

    ref = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
    new = np.array([[0.8, 0.2], [0.3, 0.7], [0.4, 0.6]])
    assert top1_agreement(ref, new) == pytest.approx(2 / 3)


def test_serving_an_unpromoted_precision_is_refused_by_name(encoder: object) -> None:
    from backends.errors import EngineError
    from backends.local.text_encoder import load_text_encoder

    with pytest.raises(EngineError, match=r"no promoted int8 artifact .* run `latentgate build"):
        load_text_encoder(precision="int8", artifacts_dir=artifacts_dir(), warmup=False)
