"""`python -m bench.semantic_eval --pairs FILE`: the command that scores held-out or a team's own
labelled pairs with the shipped operating point. It must run on a clean checkout, where the
opt-in cross-encoder has no artifact, and say whether the point is dominated by cosine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PAIRS = [
    ("How do I reset my password?", "How can I reset my password?", 1),
    ("What is the capital of France?", "What is the capital of France?", 1),
    ("How do I learn Python quickly?", "What is the fastest way to learn Python?", 1),
    ("Why is the sky blue?", "What makes the sky look blue?", 1),
    ("How do I cancel my subscription?", "How can I cancel my subscription?", 1),
    ("How far is the Moon from the Earth?", "How far is the Earth from the Sun?", 0),
    ("Is Paris bigger than London?", "Is London bigger than Paris?", 0),
    ("How do I become an electrical engineer?", "How do I become a mechanical engineer?", 0),
    ("What should I eat when I am 35 weeks pregnant?", "What should I eat at 37 weeks?", 0),
    ("Who wrote Hamlet?", "What is the best pizza in Naples?", 0),
]


def test_scores_a_pair_file_without_the_cross_encoder_artifact(tmp_path: Path) -> None:
    path = tmp_path / "team_pairs.jsonl"
    path.write_text(
        "".join(
            json.dumps({"question1": a, "question2": b, "is_duplicate": y}) + "\n"
            for a, b, y in PAIRS
        )
    )
    out_json = tmp_path / "out.json"
    env = {**os.environ, "HOME": str(tmp_path)}  # the embedding cache goes under ~/.cache
    args = ["--parts", "pooled", "--gptcache-pairs", "0", "--pairs", str(path)]
    run = subprocess.run(
        [sys.executable, "-m", "bench.semantic_eval", *args, "--json", str(out_json)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    res = json.loads(out_json.read_text())["pooled"]["team_pairs"]
    chosen = next(v for k, v in res.items() if k.startswith("features CHOSEN"))
    # the restated question and the near-identical paraphrases are served, and rightly
    assert chosen["labelled"]["hits"] >= 2 and chosen["labelled"]["precision"] > 0.5
    verdict = res["features against cosine"]
    assert isinstance(verdict["dominated"], bool) and 0.0 <= verdict["cosine_precision"] <= 1.0
    assert "dominated by cosine" in run.stdout and "CHOSEN" in run.stdout
