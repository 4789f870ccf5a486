"""A request whose tensors fit the graph's specs but whose values the model refuses (an index
out of an embedding table's range): ONNX Runtime says INVALID_ARGUMENT, and the client gets a
400 (gRPC: INVALID_ARGUMENT) naming the problem, not a 500; requests batched with it still get
their answers. Real ONNX graph, run by ONNX Runtime, called by tritonclient over HTTP and gRPC."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from gateway.app import build_app
from gateway.config import Settings
from tests.grpc.conftest import GRPC_PREFIX, client
from tests.local.conftest import wait_ready
from tests.support.servers import ServerThread

ROWS = 10  # the embedding table's size: ids 0..9 (and -10..-1) are in range


def _gather_model(path: Path) -> Path:
    """y = E[ids]: ids INT64 [N, S] into a [10, 4] table, y FP32 [N, S, 4]."""
    import onnx
    from onnx import TensorProto, helper

    table = helper.make_tensor(
        "E", TensorProto.FLOAT, [ROWS, 4], np.arange(ROWS * 4, dtype=np.float32).tolist()
    )
    graph = helper.make_graph(
        [helper.make_node("Gather", ["E", "ids"], ["y"])],
        "gather",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", "S"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "S", 4])],
        [table],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    model = _gather_model(tmp_path_factory.mktemp("models") / "gather.onnx")
    backend = {
        "kind": "onnxruntime", "model": str(model), "task": "tensor", "served_name": "gather",
        "providers": ["CPUExecutionProvider"], "batching": {"max_delay_ms": 20},
    }  # fmt: skip
    cfg: dict[str, Any] = {
        "listeners": [
            {"name": "main", "host": "127.0.0.1", "port": 0},
            {"name": "grpc", "protocol": "grpc", "host": "127.0.0.1", "port": 0},
        ],
        "backends": {"gather": backend},
        "routes": [
            {"name": "grpc-gather", "match": {"prefix": GRPC_PREFIX}, "protocol": "grpc",
             "backend": "gather", "cache": {"exact": {"enabled": True, "tiers": ["memory"]}}},
            {"name": "gather", "match": {"prefix": "/v2/models/gather"}, "protocol": "v2",
             "backend": "gather", "cache": {"exact": {"enabled": True, "tiers": ["memory"]}}},
        ],
    }  # fmt: skip
    server = ServerThread(lambda: build_app(Settings.model_validate(cfg))).start()
    wait_ready(server.url)
    yield server
    server.stop()


def _ids(mod: Any, ids: np.ndarray) -> Any:
    inp = mod.InferInput("ids", list(ids.shape), "INT64")
    inp.set_data_from_numpy(ids)
    return inp


def test_an_index_out_of_the_models_range_is_a_400_over_http(gw: ServerThread) -> None:
    c = httpclient.InferenceServerClient(gw.url.removeprefix("http://"))
    try:
        ok = c.infer("gather", [_ids(httpclient, np.array([[1, 9]], np.int64))])
        np.testing.assert_array_equal(ok.as_numpy("y")[0, 1], [36, 37, 38, 39])
        for _ in range(2):  # twice: the refusal is not stored, nor turned into a 500 on repeat
            with pytest.raises(InferenceServerException) as err:
                c.infer("gather", [_ids(httpclient, np.array([[1, 99]], np.int64))])
            assert err.value.status() == "400", err.value
            assert "out of data bounds" in str(err.value.message()), err.value
    finally:
        c.close()


def test_an_index_out_of_the_models_range_is_invalid_argument_over_grpc(gw: ServerThread) -> None:
    c = client(gw)
    try:
        with pytest.raises(InferenceServerException) as err:
            c.infer("gather", [_ids(grpcclient, np.array([[-11]], np.int64))])
        assert err.value.status() == str(grpc.StatusCode.INVALID_ARGUMENT), err.value
        assert "out of data bounds" in str(err.value.message())
        ok = c.infer("gather", [_ids(grpcclient, np.array([[0]], np.int64))])
        np.testing.assert_array_equal(ok.as_numpy("y")[0, 0], [0, 1, 2, 3])
    finally:
        c.close()


async def test_the_refused_request_spares_its_batch_mates(gw: ServerThread) -> None:
    def body(ids: list[list[int]]) -> dict[str, Any]:
        shape = [len(ids), len(ids[0])]
        flat = [i for row in ids for i in row]
        return {"inputs": [{"name": "ids", "datatype": "INT64", "shape": shape, "data": flat}]}

    async def infer(s: aiohttp.ClientSession, ids: list[list[int]]) -> tuple[int, Any]:
        async with s.post(f"{gw.url}/v2/models/gather/infer", json=body(ids)) as r:
            return r.status, await r.json()

    async with aiohttp.ClientSession() as s:
        good = [[[i % ROWS, (i + 1) % ROWS]] for i in range(12)]
        got = await asyncio.gather(infer(s, [[3, 1000]]), *(infer(s, g) for g in good))
    status, doc = got[0]
    assert status == 400 and "out of data bounds" in doc["error"], doc
    for ids, (st, d) in zip(good, got[1:], strict=True):
        assert st == 200, d
        y = np.asarray(d["outputs"][0]["data"], np.float32).reshape(d["outputs"][0]["shape"])
        np.testing.assert_array_equal(y[0, :, 0], [4 * i for i in ids[0]])
