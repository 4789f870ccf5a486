"""Texts batched into one engine run through /v1/embeddings: a text the model refuses fails only
the request that sent it. A real ONNX graph (a token embedding table smaller than the tokenizer's
vocabulary) run by ONNX Runtime, called with the openai SDK."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from backends.local.artifacts import builtin_dir
from gateway.app import build_app
from gateway.config import Settings
from tests.local.conftest import wait_ready
from tests.support.servers import ServerThread

ROWS = 3000  # MiniLM's tokenizer has 30,522 ids: "zebra" (29145) is past the table
# Common words, all under id 3000, in texts of many lengths (one length bucket or several)
WORDS = ["the", "of", "and", "in", "to", "was", "he", "is", "as", "for", "on", "with", "it",
         "his", "by", "a", "man"]  # fmt: skip
GOOD = [" ".join(WORDS[(i + k) % len(WORDS)] for k in range(1 + i % 9)) for i in range(16)]


def table_model(path: Path) -> None:
    """input_ids [B, S] → token_embeddings [B, S, 8]: a Gather from a fixed random table."""
    import onnx
    from onnx import TensorProto, helper

    table = np.random.default_rng(7).standard_normal((ROWS, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "input_ids"], ["token_embeddings"])],
        "table",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["B", "S"])
         for n in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("token_embeddings", TensorProto.FLOAT, ["B", "S", 8])],
        initializer=[helper.make_tensor("table", TensorProto.FLOAT, [ROWS, 8], table.ravel())],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    path = tmp_path_factory.mktemp("models") / "table.onnx"
    table_model(path)
    tokenizer = builtin_dir("all-MiniLM-L6-v2") / "tokenizer.json"
    cfg: dict[str, Any] = {
        "backends": {"table": {
            "kind": "onnxruntime", "model": str(path), "served_name": "table",
            "providers": ["CPUExecutionProvider"], "warmup": False,
            "preprocess": {"kind": "text", "tokenizer": str(tokenizer), "max_tokens": 64},
            # a window wide enough that concurrent requests do share a batch
            "batching": {"max_delay_ms": 20},
        }},
        "routes": [{"name": "table", "match": {"path": "/v1/embeddings"}, "protocol": "openai",
                    "backend": "table"}],
    }  # fmt: skip
    server = ServerThread(lambda: build_app(Settings.model_validate(cfg))).start()
    wait_ready(server.url)
    yield server
    server.stop()


async def test_a_refused_text_fails_only_its_own_request(gw: ServerThread) -> None:
    client = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)

    async def embed(text: str) -> list[float] | str:
        try:
            got = await client.embeddings.create(model="table", input=text)
        except openai.BadRequestError as err:
            return str(err)
        return got.data[0].embedding

    try:
        alone = [await embed(t) for t in GOOD]
        for _ in range(3):
            got = await asyncio.gather(embed("a zebra"), *(embed(t) for t in GOOD))
            assert isinstance(got[0], str) and "out of data bounds" in got[0], got[0]
            for text, mine, own in zip(GOOD, got[1:], alone, strict=True):
                assert not isinstance(mine, str), (text, mine)
                np.testing.assert_allclose(mine, own, atol=1e-6)
    finally:
        await client.close()
