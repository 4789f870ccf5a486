"""Concurrent requests to local tensor models: batched when the graph allows, each request's
answer and failure its own. Real ONNX graphs, run by ONNX Runtime."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from gateway.app import build_app
from gateway.config import Settings
from tests.local.conftest import wait_ready
from tests.support.servers import ServerThread


def _save(path: Path, inputs: list[Any], outputs: list[Any], nodes: list[Any]) -> None:
    import onnx
    from onnx import helper

    graph = helper.make_graph(nodes, path.stem, inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(path))


def build_models(d: Path) -> dict[str, Path]:
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    two = helper.make_tensor("two", f, [], [2.0])
    out = {}
    # a fixed batch size of one: y = 2x, x [1, 3]
    out["fixed"] = d / "fixed.onnx"
    _save(
        out["fixed"],
        [helper.make_tensor_value_info("x", f, [1, 3])],
        [helper.make_tensor_value_info("y", f, [1, 3])],
        [
            helper.make_node("Constant", [], ["c"], value=two),
            helper.make_node("Mul", ["x", "c"], ["y"]),
        ],
    )
    # two inputs that must agree on rows: z = x + y, [N, 4] each
    out["twoin"] = d / "twoin.onnx"
    _save(
        out["twoin"],
        [helper.make_tensor_value_info(n, f, ["N", 4]) for n in ("x", "y")],
        [helper.make_tensor_value_info("z", f, ["N", 4])],
        [helper.make_node("Add", ["x", "y"], ["z"])],
    )
    # an output without the batch dimension: total = sum(x), x [N, 3]
    out["scalar"] = d / "scalar.onnx"
    _save(
        out["scalar"],
        [helper.make_tensor_value_info("x", f, ["N", 3])],
        [helper.make_tensor_value_info("total", f, [])],
        [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0)],
    )
    # a dynamic dimension 0 that is not the batch: flat = reshape(x, [-1]), x [N, 4] → [4N]
    out["flat"] = d / "flat.onnx"
    _save(
        out["flat"],
        [helper.make_tensor_value_info("x", f, ["N", 4])],
        [helper.make_tensor_value_info("flat", f, ["M"])],
        [
            helper.make_node("Constant", [], ["s"], value=helper.make_tensor("s", 7, [1], [-1])),
            helper.make_node("Reshape", ["x", "s"], ["flat"]),
        ],
    )
    return out


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    models = build_models(tmp_path_factory.mktemp("models"))
    cfg: dict[str, Any] = {"backends": {}, "routes": []}
    for name, path in models.items():
        cfg["backends"][name] = {
            "kind": "onnxruntime",
            "model": str(path),
            "task": "tensor",
            "served_name": name,
            "providers": ["CPUExecutionProvider"],
            # a window wide enough that concurrent requests do share a batch
            "batching": {"max_delay_ms": 20},
        }
        cfg["routes"].append(
            {
                "name": name,
                "match": {"prefix": f"/v2/models/{name}"},
                "protocol": "v2",
                "backend": name,
            }
        )
    server = ServerThread(lambda: build_app(Settings.model_validate(cfg))).start()
    wait_ready(server.url)
    yield server
    server.stop()


def _tensor(name: str, arr: np.ndarray) -> dict[str, Any]:
    return {
        "name": name,
        "datatype": "FP32",
        "shape": list(arr.shape),
        "data": arr.ravel().tolist(),
    }


async def _infer(
    s: aiohttp.ClientSession, url: str, model: str, **inputs: np.ndarray
) -> tuple[int, dict[str, Any]]:
    body = {"inputs": [_tensor(k, v) for k, v in inputs.items()]}
    async with s.post(f"{url}/v2/models/{model}/infer", json=body) as r:
        return r.status, await r.json()


def _out(doc: dict[str, Any]) -> np.ndarray:
    o = doc["outputs"][0]
    return np.asarray(o["data"], np.float32).reshape(o["shape"])


async def test_a_fixed_batch_size_model_answers_concurrent_requests(gw: ServerThread) -> None:
    xs = [np.full((1, 3), i, np.float32) for i in range(24)]
    async with aiohttp.ClientSession() as s:
        got = await asyncio.gather(*(_infer(s, gw.url, "fixed", x=x) for x in xs))
    assert [st for st, _ in got] == [200] * 24, got[:2]
    for x, (_, doc) in zip(xs, got, strict=True):
        np.testing.assert_array_equal(_out(doc), x * 2)


async def test_inputs_that_disagree_on_rows_are_a_400_and_spare_their_batch_mates(
    gw: ServerThread,
) -> None:
    good = [np.full((2, 4), i, np.float32) for i in range(20)]
    async with aiohttp.ClientSession() as s:
        bad = _infer(
            s, gw.url, "twoin", x=np.ones((2, 4), np.float32), y=np.ones((1, 4), np.float32)
        )
        got = await asyncio.gather(bad, *(_infer(s, gw.url, "twoin", x=g, y=g) for g in good))
    status, doc = got[0]
    assert status == 400 and "dimension 0" in doc["error"]
    for g, (st, d) in zip(good, got[1:], strict=True):
        assert st == 200
        np.testing.assert_array_equal(_out(d), g + g)


async def test_a_model_whose_output_has_no_batch_dimension(gw: ServerThread) -> None:
    xs = [np.full((2, 3), i, np.float32) for i in range(8)]
    async with aiohttp.ClientSession() as s:
        got = await asyncio.gather(*(_infer(s, gw.url, "scalar", x=x) for x in xs))
    for x, (st, d) in zip(xs, got, strict=True):
        assert st == 200, d
        assert float(np.asarray(d["outputs"][0]["data"]).ravel()[0]) == float(x.sum())


async def test_an_output_whose_dimension_0_is_not_the_batch_is_each_requests_own(
    gw: ServerThread,
) -> None:
    import tritonclient.http.aio as aioclient

    xs = [np.arange(4 * i, 4 * i + 4, dtype=np.float32)[None] for i in range(12)]

    async def infer(c: aioclient.InferenceServerClient, x: np.ndarray) -> np.ndarray:
        inp = aioclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        got: np.ndarray = (await c.infer("flat", [inp])).as_numpy("flat")
        return got

    c = aioclient.InferenceServerClient(gw.url.removeprefix("http://"))
    try:
        for _ in range(3):  # (the first batch finds out; later ones must not mix either)
            got = await asyncio.gather(*(infer(c, x) for x in xs))
            for x, y in zip(xs, got, strict=True):
                np.testing.assert_array_equal(y, x.ravel())
    finally:
        await c.close()


async def test_a_missing_second_input_is_a_400_naming_it(gw: ServerThread) -> None:
    async with aiohttp.ClientSession() as s:
        status, doc = await _infer(s, gw.url, "twoin", x=np.ones((1, 4), np.float32))
    assert status == 400 and doc["error"] == "model twoin needs input 'y'", doc
