"""`latentgate serve` refusing to start as an operator's supervisor sees it: one line that names
what is wrong, exit code 2, no traceback (and never a start on something other than was asked)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import base_config
from tests.support.servers import ROOT, ServerThread, free_port


def _serve(cfg: dict[str, Any], tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "lg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    # (the timeout only ends a test whose server started: a refusal is over in seconds)
    return subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--config", str(path), *flags],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_unix_listener_that_cannot_bind_is_one_line_and_exit_code_2(
    upstream: ServerThread, tmp_path: Path, workers: str
) -> None:
    sock = tmp_path / "no-such-dir" / "lg.sock"
    cfg = base_config(upstream.url)
    cfg["listeners"] = [{"name": "sidecar", "unix": str(sock)}]
    proc = _serve(cfg, tmp_path, "--workers", workers)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"listener 'sidecar': cannot listen on unix socket {sock}" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--port", "70000"], "argument --port: 70000 is not a port"),  # it listened on 4464
        (["--port", "-1"], "argument --port: -1 is not a port"),
        (["--workers", "0"], "argument --workers: 0: at least 1 worker"),
    ],
)
def test_a_flag_out_of_range_is_refused_before_anything_starts(
    upstream: ServerThread, tmp_path: Path, flags: list[str], said: str
) -> None:
    cfg = base_config(upstream.url)
    cfg["listeners"] = [{"name": "main", "host": "127.0.0.1", "port": free_port()}]
    proc = _serve(cfg, tmp_path, *flags)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert said in proc.stderr
    assert "Traceback" not in proc.stderr


def _semantic_config(upstream_url: str, artifact: Path) -> dict[str, Any]:
    cfg = base_config(upstream_url)
    cfg["cache"] = {"semantic": {"verifier_artifact": str(artifact)}}
    cfg["routes"][0]["cache"] = {"exact": {"enabled": True}, "semantic": {"enabled": True}}
    return cfg


@pytest.mark.parametrize("kind", ["missing", "not_an_npz"])
def test_a_verifier_artifact_that_does_not_load_is_refused_naming_the_setting(
    upstream: ServerThread, tmp_path: Path, kind: str
) -> None:
    artifact = tmp_path / "verifier.npz"
    if kind == "not_an_npz":
        artifact.write_bytes(b"not an npz\n")
    cfg = _semantic_config(upstream.url, artifact)
    proc = _serve(cfg, tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    said = [line for line in proc.stderr.splitlines() if "refusing to start" in line]
    assert len(said) == 1, proc.stderr[-2000:]
    assert "route chat" in said[0]
    assert "cache.semantic.verifier_artifact" in said[0]
    assert str(artifact) in said[0]
    check = subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", str(tmp_path / "lg.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert check.returncode == 1
    assert "cache.semantic.verifier_artifact" in check.stderr


@pytest.mark.parametrize("tokenizer", [None, "missing"])
def test_an_onnx_embedder_without_its_tokenizer_file_is_refused_naming_the_setting(
    upstream: ServerThread, tmp_path: Path, tokenizer: str | None
) -> None:
    model = tmp_path / "encoder.onnx"
    model.write_bytes(b"an ONNX file, as far as the start is concerned")
    preprocess: dict[str, Any] = {"kind": "text"}
    if tokenizer is not None:
        preprocess["tokenizer"] = str(tmp_path / "tokenizer.json")  # not there
    cfg = base_config(upstream.url)
    cfg["backends"]["encoder"] = {
        "kind": "onnxruntime",
        "model": str(model),
        "preprocess": preprocess,
    }
    cfg["routes"][2]["backend"] = "encoder"  # embeddings
    proc = _serve(cfg, tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    said = [line for line in proc.stderr.splitlines() if "refusing to start" in line]
    assert len(said) == 1, proc.stderr[-2000:]
    assert "backend 'encoder'" in said[0]
    assert "(preprocess.tokenizer)" in said[0]
    assert "Traceback" not in proc.stderr
