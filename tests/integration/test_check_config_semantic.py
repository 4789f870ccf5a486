"""A semantic cache where its hits are wrong by construction is a config error, said with its
path and line by `check-config` and by `serve` before it starts: on a route whose backend is a
local embedding model (a near-duplicate text was answered with the other text's embedding) and
on an OpenAI embeddings route (which the stage never reads). A remote v2 model may compute
anything: its semantic cache is the operator's call."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.config import ConfigError, parse_settings
from tests.support.servers import ROOT

HEAD = """\
backends:
  minilm:
    kind: onnxruntime
    model: builtin:all-MiniLM-L6-v2
  upstream:
    kind: remote
    replicas: ["http://127.0.0.1:8000"]
routes:
"""

LOCAL_V2 = (
    HEAD
    + """\
  - name: local-v2
    match: {prefix: /v2/models/all-MiniLM-L6-v2/}
    protocol: v2
    backend: minilm
    cache:
      exact: {enabled: true}
      semantic:
        enabled: true
        field: text
"""
)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_check_config_refuses_semantic_on_a_local_embedding_v2_route(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(LOCAL_V2)
    out = _run("check-config", str(cfg))
    assert out.returncode == 1, out.stderr
    assert "1 error(s)" in out.stderr, out.stderr
    assert "routes.0.cache.semantic.enabled (line 16): " in out.stderr, out.stderr
    assert "'minilm' is a local embedding model" in out.stderr


def test_serve_refuses_it_before_starting(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(LOCAL_V2)
    out = _run("serve", "--config", str(cfg), "--port", "0")
    assert out.returncode == 2, out.stderr
    assert "routes.0.cache.semantic.enabled (line 16): " in out.stderr, out.stderr


@pytest.mark.parametrize(
    ("protocol", "match"),
    [
        ("openai", "{path: /v1/embeddings}"),  # the local model's OpenAI face
        ("grpc", "{path: /inference.GRPCInferenceService/ModelInfer}"),
    ],
)
def test_every_face_of_a_local_embedder_is_refused(protocol: str, match: str) -> None:
    text = HEAD + (
        f"  - name: r\n    match: {match}\n    protocol: {protocol}\n    backend: minilm\n"
        "    cache: {semantic: {enabled: true}}\n"
    )
    with pytest.raises(ConfigError) as err:
        parse_settings(text)
    [issue] = err.value.issues
    assert (issue.path, issue.line) == ("routes.0.cache.semantic.enabled", 13)


@pytest.mark.parametrize("path", ["/v1/embeddings", "/openai/deployments/d/embeddings"])
def test_semantic_on_an_openai_embeddings_route_is_refused(path: str) -> None:
    text = HEAD + (
        f"  - name: emb\n    match: {{path: {path}}}\n    protocol: openai\n"
        "    backend: upstream\n    cache:\n      semantic: {enabled: true}\n"
    )
    with pytest.raises(ConfigError) as err:
        parse_settings(text)
    [issue] = err.value.issues
    assert issue.path == "routes.0.cache.semantic.enabled" and issue.line == 14
    assert "embeddings are never answered semantically" in issue.message


def test_what_may_be_right_is_still_taken() -> None:
    """A remote v2 model, a local tensor model, an OpenAI prefix route (its chat is semantic,
    its embeddings never: tests/semantic/test_embeddings_never_semantic.py) and a local
    embedder with semantic off all load."""
    text = (
        HEAD
        + """\
  - name: remote-v2
    match: {prefix: /v2/}
    protocol: v2
    backend: upstream
    cache: {exact: {enabled: true}, semantic: {enabled: true, field: text}}
  - name: openai
    match: {prefix: /v1/}
    protocol: openai
    backend: upstream
    cache: {exact: {enabled: true}, semantic: {enabled: true}}
  - name: local-off
    match: {prefix: /v2/models/all-MiniLM-L6-v2/}
    protocol: v2
    backend: minilm
    cache: {exact: {enabled: true}, semantic: {enabled: false, field: text}}
"""
    )
    parse_settings(text)
    tensor = text.replace("model: builtin:all-MiniLM-L6-v2", "model: m.onnx\n    task: tensor")
    parse_settings(tensor.replace("enabled: false, field", "enabled: true, field"))


def test_a_budget_on_a_v2_route_is_said_with_its_line(tmp_path: Path) -> None:
    """Before, this cross-reference was dropped from the report: check-config printed
    "0 error(s)" and exited 1, and serve exited 2 saying nothing."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        HEAD
        + "  - name: v2\n    match: {prefix: /v2/}\n    protocol: v2\n    backend: upstream\n"
        + "    cache:\n      semantic:\n        enabled: true\n        max_error_rate: 0.05\n"
    )
    out = _run("check-config", str(cfg))
    assert out.returncode == 1 and "1 error(s)" in out.stderr, out.stderr
    assert "routes.0.cache.semantic.max_error_rate (line 16): " in out.stderr, out.stderr
    out = _run("serve", "--config", str(cfg), "--port", "0")
    assert out.returncode == 2 and "max_error_rate (line 16)" in out.stderr, out.stderr
