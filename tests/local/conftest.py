"""Fixtures for local engines: the real MiniLM, loaded once per session, and its reference model."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backends.local.text_encoder import TextEncoder, load_text_encoder
from gateway.app import build_app
from gateway.codings import SERVER_OPTIONS
from gateway.config import Settings
from tests.support.servers import ServerThread

STSB = Path("/work/shared/data/stsb/sts-dev.csv")
SENTENCES = [
    "A man is playing a guitar.",
    "hi",
    "The quick brown fox jumps over the lazy dog near the riverbank at dawn.",
    "Ein Mann spielt Gitarre.",
    "What is the capital of France?",
    "embedding " * 60,
]


def artifacts_dir() -> str | None:
    # Unset: the default per-user cache, so the one-time ONNX export is shared across runs.
    return os.environ.get("LATENTGATE_ARTIFACTS") or None


@pytest.fixture(scope="session")
def encoder() -> Iterator[TextEncoder]:
    enc = load_text_encoder(providers=["CPUExecutionProvider"], artifacts_dir=artifacts_dir())
    yield enc
    # The batcher's worker thread is joined by aclose; run it on a throwaway loop.
    import asyncio

    asyncio.run(enc.aclose())


@pytest.fixture(scope="session")
def reference() -> Any:
    """sentence-transformers on the same packaged weights: what users compare against."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    from backends.local.artifacts import builtin_dir

    return SentenceTransformer(str(builtin_dir("all-MiniLM-L6-v2")), device="cpu")


def st_encode(reference: Any, texts: list[str]) -> np.ndarray:
    return np.asarray(reference.encode(texts, normalize_embeddings=True), np.float32)


def local_config(**backend: Any) -> dict[str, Any]:
    """A gateway with the builtin MiniLM as a local backend; everything else goes upstream."""
    minilm = {
        "kind": "onnxruntime", "model": "builtin:all-MiniLM-L6-v2",
        "providers": ["CPUExecutionProvider"], "artifacts_dir": artifacts_dir(),
        "preprocess": {"kind": "text", "max_tokens": 256, "truncate": False},
        "batching": {"max_batch": 32, "max_delay_ms": 2},
    }  # fmt: skip
    minilm.update(backend)
    return {
        "backends": {
            "minilm": minilm,
            "upstream": {"kind": "remote", "replicas": ["http://127.0.0.1:9"]},
        },
        "routes": [
            {"name": "local-embeddings", "protocol": "openai", "backend": "minilm",
             "match": {"path": "/v1/embeddings", "methods": ["POST"],
                       "model": "all-MiniLM-L6-v2"}},
            {"name": "embeddings", "match": {"path": "/v1/embeddings"}, "protocol": "openai",
             "backend": "upstream"},
            {"name": "local-v2", "match": {"prefix": "/v2/"}, "protocol": "v2",
             "backend": "minilm"},
            {"name": "default", "match": {"prefix": "/"}, "backend": "upstream"},
        ],
    }  # fmt: skip


def wait_ready(url: str, timeout: float = 120.0) -> dict[str, Any]:
    import json
    import time
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=5) as resp:
                return dict(json.loads(resp.read()))
        except urllib.error.HTTPError as err:
            doc = json.loads(err.read())
            failed = {n: b["error"] for n, b in doc["backends"].items() if b.get("error")}
            if failed or time.monotonic() > deadline:
                raise RuntimeError(f"gateway not ready: {failed or doc}") from None
            time.sleep(0.1)


@pytest.fixture(scope="module")
def local_gateway() -> Iterator[ServerThread]:
    settings = Settings.model_validate(local_config())
    server = ServerThread(lambda: build_app(settings), runner_kwargs=SERVER_OPTIONS).start()
    wait_ready(server.url)
    yield server
    server.stop()


def http(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    """A plain HTTP call (urllib): status and the JSON (or text) body, errors included."""
    import json
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()
