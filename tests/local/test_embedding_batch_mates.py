"""Texts batched into one engine run through /v1/embeddings: a text the model refuses fails only
the request that sent it, and padding never reaches a model that cannot mask it. Real ONNX graphs
(a token embedding table smaller than the tokenizer's vocabulary; one without an attention mask)
run by ONNX Runtime, called with the openai SDK."""

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


def unmasked_model(path: Path) -> None:
    """input_ids [B, S] only → token_embeddings = e + mean(e over S), e = table[input_ids]: each
    token reads the whole sequence, padding included, as unmasked attention does."""
    import onnx
    from onnx import TensorProto, helper

    table = np.random.default_rng(8).standard_normal((ROWS, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "input_ids"], ["e"]),
         helper.make_node("ReduceMean", ["e"], ["m"], axes=[1], keepdims=1),
         helper.make_node("Add", ["e", "m"], ["token_embeddings"])],
        "unmasked",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", "S"])],
        [helper.make_tensor_value_info("token_embeddings", TensorProto.FLOAT, ["B", "S", 8])],
        initializer=[helper.make_tensor("table", TensorProto.FLOAT, [ROWS, 8], table.ravel())],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    d = tmp_path_factory.mktemp("models")
    table_model(d / "table.onnx")
    unmasked_model(d / "unmasked.onnx")
    tokenizer = builtin_dir("all-MiniLM-L6-v2") / "tokenizer.json"
    cfg: dict[str, Any] = {"backends": {}, "routes": []}
    for name in ("table", "unmasked"):
        cfg["backends"][name] = {
            "kind": "onnxruntime", "model": str(d / f"{name}.onnx"), "served_name": name,
            "providers": ["CPUExecutionProvider"], "warmup": False,
            "preprocess": {"kind": "text", "tokenizer": str(tokenizer), "max_tokens": 64},
            # a window wide enough that concurrent requests do share a batch
            "batching": {"max_delay_ms": 20},
        }  # fmt: skip
        cfg["routes"].append({"name": name, "protocol": "openai", "backend": name,
                              "match": {"path": "/v1/embeddings", "model": name}})  # fmt: skip
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


async def test_a_model_without_an_attention_mask_never_reads_padding(gw: ServerThread) -> None:
    client = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)

    async def embed(text: str | list[str]) -> list[list[float]]:
        got = await client.embeddings.create(model="unmasked", input=text)
        return [d.embedding for d in got.data]

    try:
        alone = [(await embed(t))[0] for t in GOOD]
        for _ in range(3):
            got = await asyncio.gather(*(embed(t) for t in GOOD))
            for text, mine, own in zip(GOOD, got, alone, strict=True):
                np.testing.assert_allclose(mine[0], own, atol=1e-6, err_msg=text)
        # one request of texts of many lengths: each as it is alone
        np.testing.assert_allclose(await embed(GOOD), alone, atol=1e-6)
    finally:
        await client.close()
