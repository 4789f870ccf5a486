"""The codebase holds its own standards: ruff (lint and format) and mypy --strict stay clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PATHS = ["gateway", "cache", "backends", "tests", "bench", "scripts"]


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=580)


@pytest.mark.parametrize("mode", ["check", "format"])
def test_ruff_clean(mode: str) -> None:
    args = ["check", "--output-format", "concise"] if mode == "check" else ["format", "--check"]
    result = _run(str(BIN / "ruff"), *args, *PATHS)
    assert result.returncode == 0, result.stdout + result.stderr


# A fresh clone has no .mypy_cache: a cold strict run over three packages and their stubs takes
# minutes on a loaded 2-core machine, past the suite's default per-test timeout.
@pytest.mark.timeout(600)
def test_mypy_strict_clean() -> None:
    result = _run(str(BIN / "mypy"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_resource_warnings_fail_the_suite() -> None:
    # An unclosed socket, transport, session or loop fails the test that leaked it (pytest turns
    # the ResourceWarning raised in __del__ into an error under "error"): nothing may filter it.
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    filters = config["filterwarnings"]
    assert filters[0] == "error"
    assert not [f for f in filters if "ResourceWarning" in f or "Unraisable" in f]
