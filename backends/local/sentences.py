"""Sentences for accuracy reports and calibration: STS-B rows or plain text, one per line.

Its own module so the builder and the text encoder (INT8 calibration) both use it without
importing each other.
"""

from __future__ import annotations

import csv
from pathlib import Path

from backends.errors import EngineError

VALIDATION_LIMIT = 512


def read_sentences(path: str, limit: int = VALIDATION_LIMIT) -> list[str]:
    """STS-B rows (tab-separated, sentences in columns 6 and 7) or plain text, one per line."""
    p = Path(path)
    if not p.is_file():
        raise EngineError(
            f"validation/calibration file {path} does not exist (pass --validation FILE: plain "
            "text, one sentence per line)"
        )
    out: list[str] = []
    with p.open(encoding="utf-8") as f:
        if p.suffix == ".csv":
            for row in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
                out.extend(s for s in row[5:7] if s)
        else:
            out = [line.strip() for line in f if line.strip()]
    return list(dict.fromkeys(out))[:limit]
