"""A dynamically quantized graph takes its activation scales over the whole run: requests must not
share one, or a text's vector depends on what was batched beside it. A real graph, quantized by
onnxruntime.quantization.quantize_dynamic, served through /v1/embeddings (openai SDK)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from backends.local.artifacts import builtin_dir
from backends.local.onnx import dynamically_quantized
from gateway.app import build_app
from gateway.config import Settings
from tests.local.conftest import wait_ready
from tests.support.servers import ServerThread

ROWS, DIM = 3000, 8
LOUD = 2010  # "his": its embedding is 100 times the others', as an outlier activation is
SHORT = ["a man", "the man", "he was", "it is", "on the man"]
LOUD_MATES = ["his his his of the and in to was he is as", "by his man", "his"]


def quantized_model(d: Path) -> Path:
    """input_ids [B, S] → token_embeddings = table[input_ids] @ w, then quantize_dynamic."""
    import onnx
    from onnx import TensorProto, helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(3)
    table = rng.standard_normal((ROWS, DIM)).astype(np.float32)
    table[LOUD] *= 100
    w = rng.standard_normal((DIM, DIM)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "input_ids"], ["x"]),
         helper.make_node("MatMul", ["x", "w"], ["token_embeddings"])],
        "qtable",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["B", "S"])
         for n in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("token_embeddings", TensorProto.FLOAT, ["B", "S", DIM])],
        initializer=[helper.make_tensor("table", TensorProto.FLOAT, [ROWS, DIM], table.ravel()),
                     helper.make_tensor("w", TensorProto.FLOAT, [DIM, DIM], w.ravel())],
    )  # fmt: skip
    fp32 = d / "qtable.fp32.onnx"
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
        str(fp32),
    )
    out = d / "qtable.onnx"
    quantize_dynamic(
        str(fp32), str(out), op_types_to_quantize=["MatMul"], weight_type=QuantType.QInt8
    )
    assert dynamically_quantized(str(out)) and not dynamically_quantized(str(fp32))
    return out


def quantized_tensor_model(d: Path) -> Path:
    """x [N, 8] → y = x @ w [N, 8], then quantize_dynamic: a v2 tensor model."""
    import onnx
    from onnx import TensorProto, helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    w = np.random.default_rng(4).standard_normal((DIM, DIM)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "qmatmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", DIM])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", DIM])],
        initializer=[helper.make_tensor("w", TensorProto.FLOAT, [DIM, DIM], w.ravel())],
    )  # fmt: skip
    fp32 = d / "qmatmul.fp32.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(fp32))
    out = d / "qmatmul.onnx"
    quantize_dynamic(str(fp32), str(out), weight_type=QuantType.QInt8)
    return out


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    d = tmp_path_factory.mktemp("models")
    path = quantized_model(d)
    tokenizer = builtin_dir("all-MiniLM-L6-v2") / "tokenizer.json"
    cfg: dict[str, Any] = {
        "backends": {"q": {
            "kind": "onnxruntime", "model": str(path), "served_name": "q",
            "providers": ["CPUExecutionProvider"], "warmup": False,
            "preprocess": {"kind": "text", "tokenizer": str(tokenizer), "max_tokens": 64},
            # a window wide enough that concurrent requests do share a batch
            "batching": {"max_delay_ms": 20},
        }, "qt": {
            "kind": "onnxruntime", "model": str(quantized_tensor_model(d)), "task": "tensor",
            "served_name": "qt", "providers": ["CPUExecutionProvider"],
            "batching": {"max_delay_ms": 20},
        }},
        "routes": [{"name": "q", "match": {"path": "/v1/embeddings"}, "protocol": "openai",
                    "backend": "q"},
                   {"name": "qt", "match": {"prefix": "/v2/models/qt"}, "protocol": "v2",
                    "backend": "qt"}],
    }  # fmt: skip
    server = ServerThread(lambda: build_app(Settings.model_validate(cfg))).start()
    wait_ready(server.url)
    yield server
    server.stop()


async def test_a_texts_vector_does_not_depend_on_its_batch_mates(gw: ServerThread) -> None:
    client = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)

    async def embed(text: str | list[str]) -> list[list[float]]:
        got = await client.embeddings.create(model="q", input=text)
        return [d.embedding for d in got.data]

    try:
        alone = [(await embed(t))[0] for t in SHORT]
        for _ in range(3):
            got = await asyncio.gather(*(embed(t) for t in SHORT), *(embed(t) for t in LOUD_MATES))
            for text, mine, own in zip(SHORT, got[: len(SHORT)], alone, strict=True):
                np.testing.assert_allclose(mine[0], own, atol=1e-6, err_msg=text)
        # and within one request: each text as it is alone
        together = await embed([*SHORT, *LOUD_MATES])
        np.testing.assert_allclose(together[: len(SHORT)], alone, atol=1e-6)
    finally:
        await client.close()


async def test_a_v2_requests_rows_do_not_depend_on_its_batch_mates(gw: ServerThread) -> None:
    import tritonclient.http.aio as aioclient

    rng = np.random.default_rng(5)
    quiet = [rng.standard_normal((1, DIM)).astype(np.float32) for _ in range(6)]
    loud = [100 * rng.standard_normal((2, DIM)).astype(np.float32) for _ in range(3)]

    async def infer(c: aioclient.InferenceServerClient, x: np.ndarray) -> np.ndarray:
        inp = aioclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        got: np.ndarray = (await c.infer("qt", [inp])).as_numpy("y")
        return got

    c = aioclient.InferenceServerClient(gw.url.removeprefix("http://"))
    try:
        alone = [await infer(c, x) for x in quiet]
        for _ in range(3):
            got = await asyncio.gather(*(infer(c, x) for x in [*quiet, *loud]))
            for mine, own in zip(got[: len(quiet)], alone, strict=True):
                np.testing.assert_allclose(mine, own, atol=1e-6)
    finally:
        await c.close()
