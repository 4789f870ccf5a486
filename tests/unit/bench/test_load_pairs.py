"""bench.semantic_data.load_pairs: held-out splits and a team's own labelled pairs are read
right whatever their layout, or refused with the file named."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bench.semantic_data import load_pairs

PAIRS = [
    ("How do I learn Python?", "What is the best way to learn Python?", 1),
    ("Is 2+3 equal to 5?", "Is 2+4 equal to 5?", 0),
]


@pytest.mark.parametrize(
    "keys",
    [("text_a", "text_b", "label"), ("question1", "question2", "is_duplicate")],
)
def test_json_lines_with_either_header(tmp_path: Path, keys: tuple[str, str, str]) -> None:
    path = tmp_path / "pairs.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        for a, b, y in PAIRS:
            fh.write(json.dumps(dict(zip(keys, (a, b, y), strict=True))) + "\n")
    ps = load_pairs(path)
    assert ps.name == "pairs"
    assert ps.a == [a for a, _, _ in PAIRS] and ps.b == [b for _, b, _ in PAIRS]
    assert ps.label.tolist() == [1, 0]


def test_tsv_with_a_header_in_any_column_order(tmp_path: Path) -> None:
    path = tmp_path / "test.tsv"
    lines = ["label\tid\tsentence2\tsentence1"]
    lines += [f"{y}\t{i}\t{b}\t{a}" for i, (a, b, y) in enumerate(PAIRS)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ps = load_pairs(path)
    assert ps.a[0] == PAIRS[0][0] and ps.b[1] == PAIRS[1][1]
    assert ps.label.tolist() == [1, 0]


def test_headerless_tokenised_tsv_is_detokenised(tmp_path: Path) -> None:
    # PAWS's layout: text, text, label; its sentences are tokenised ("Romania .").
    path = tmp_path / "paws.tsv"
    path.write_text(
        "The river flows into Romania .\tThe river flows out of Romania .\t0\n"
        "It is , in fact , red .\tIn fact , it is red .\t1\n",
        encoding="utf-8",
    )
    ps = load_pairs(path)
    assert ps.a == ["The river flows into Romania.", "It is, in fact, red."]
    assert ps.label.tolist() == [0, 1]


def test_ordinary_text_keeps_its_spacing(tmp_path: Path) -> None:
    path = tmp_path / "own.tsv"
    path.write_text(
        "a\tb\t1\nWhat is 3 .5 cm in inches?\tHow many inches is 3.5 cm?\t1\n"
        + "".join(f"Question {i}?\tAnother question {i}?\t0\n" for i in range(5)),
        encoding="utf-8",
    )
    ps = load_pairs(path)
    assert "What is 3 .5 cm in inches?" in ps.a
    assert len(ps) == 7


def test_graded_scores_count_as_duplicates_from_four(tmp_path: Path) -> None:
    # STS-B: genre, file, year, id, score (0-5), sentence 1, sentence 2.
    path = tmp_path / "sts-test.csv"
    rows = [("5.000", "A man is dancing.", "A man dances."), ("1.000", "A cat.", "A car.")]
    rows += [("4.000", "Kids play.", "Children play."), ("3.800", "A dog runs.", "A dog ran.")]
    path.write_text(
        "".join(
            f"main\tMSRvid\t2012test\t{i:04d}\t{s}\t{a}\t{b}\n" for i, (s, a, b) in enumerate(rows)
        ),
        encoding="utf-8",
    )
    ps = load_pairs(path)
    assert ps.name == "sts-test"
    # 1.000 is a low score here, not a "duplicate" label: the file is graded.
    assert ps.label.tolist() == [1, 0, 1, 0]


def test_a_file_without_pairs_is_refused_with_its_name(tmp_path: Path) -> None:
    path = tmp_path / "empty.tsv"
    path.write_text("just one column\nand another\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"empty\.tsv"):
        load_pairs(path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"q": "a", "r": "b"}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.jsonl"):
        load_pairs(bad)
