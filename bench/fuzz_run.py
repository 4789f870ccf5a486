"""The larger fuzz run: tests/ops/test_fuzz.py with N examples per test instead of CI's 500.

One command: .venv/bin/python bench/fuzz_run.py [--examples 5000]
Prints the inputs tried, the gateway's own 5xx (must be 0: the run stops at the first) and the
upstream's 5xx that were passed through, and the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=5000)
    args = ap.parse_args()
    report = tempfile.mktemp(suffix=".json", prefix="lg-fuzz-")
    env = {
        **os.environ,
        "LATENTGATE_FUZZ_EXAMPLES": str(args.examples),
        "LATENTGATE_FUZZ_REPORT": report,
        "PYTHONPATH": str(ROOT),
    }
    t0 = time.perf_counter()
    code = subprocess.call(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-x",
            "--timeout=0",
            "-p",
            "no:cacheprovider",
            "tests/ops/test_fuzz.py",
        ],
        cwd=ROOT,
        env=env,
    )
    took = time.perf_counter() - t0
    totals = json.loads(Path(report).read_text()) if Path(report).exists() else {}
    print(
        f"examples per test {args.examples}: inputs tried {totals.get('requests', '?')}, "
        f"gateway 5xx {totals.get('gateway_5xx', '?')}, upstream 5xx passed through "
        f"{totals.get('upstream_5xx', '?')}, {took:.0f} s, pytest exit {code}"
    )
    return code


if __name__ == "__main__":
    raise SystemExit(main())
