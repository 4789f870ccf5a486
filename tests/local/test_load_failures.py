"""A local model whose load fails in the background says so: /readyz names the failure, and a
request to it is told why, instead of the load showing as still going and requests a bare 500."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from backends.local.artifacts import resolve
from gateway.app import build_app
from gateway.codings import SERVER_OPTIONS
from gateway.config import Settings
from tests.local.conftest import artifacts_dir, http, local_config
from tests.support.servers import ServerThread


def _readyz(url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=5) as resp:
            return dict(json.loads(resp.read()))
    except urllib.error.HTTPError as err:
        return dict(json.loads(err.read()))


def test_a_tokenizer_that_does_not_parse_is_a_failed_load_that_names_it(tmp_path: Path) -> None:
    onnx = resolve("builtin:all-MiniLM-L6-v2", artifacts_dir()).onnx_path  # a real embedder
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text("{ this is not a tokenizer")
    cfg = local_config(
        model=str(onnx),
        served_name="all-MiniLM-L6-v2",  # (the name the config's local route matches)
        preprocess={"kind": "text", "tokenizer": str(tokenizer)},
    )
    settings = Settings.model_validate(cfg)
    server = ServerThread(lambda: build_app(settings), runner_kwargs=SERVER_OPTIONS).start()
    try:
        deadline = time.monotonic() + 120  # (a hang guard: the load fails in well under it)
        while (backend := _readyz(server.url)["backends"]["minilm"])["error"] is None:
            assert backend["load"]["step"] != "ready"
            assert time.monotonic() < deadline, backend
            time.sleep(0.1)
        assert f"tokenizer {tokenizer} does not load" in backend["error"]
        assert backend["load"]["step"] == "failed"
        body = {"model": "all-MiniLM-L6-v2", "input": "hello"}
        status, answer = http("POST", server.url + "/v1/embeddings", body)
        assert status >= 500
        assert f"tokenizer {tokenizer} does not load" in json.dumps(answer)
    finally:
        server.stop()
