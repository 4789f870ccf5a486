"""A local model with string tensors (ONNX `tensor(string)`, v2 BYTES): served over HTTP v2 (JSON
and binary, tritonclient) and gRPC. Real ONNX graph (Cast to and from string) on ONNX Runtime."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from gateway.app import build_app
from gateway.config import Settings
from tests.grpc.conftest import GRPC_PREFIX, client
from tests.local.conftest import http, wait_ready
from tests.support.servers import ServerThread


def _cast_model(path: Path) -> Path:
    """label = string(x) for x FP32 [N, 1]; z = float(s) for s a string [N, 1]."""
    import onnx
    from onnx import TensorProto, helper

    def tensor(name: str, kind: int) -> Any:
        return helper.make_tensor_value_info(name, kind, ["N", 1])

    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["label"], to=TensorProto.STRING),
         helper.make_node("Cast", ["s"], ["z"], to=TensorProto.FLOAT)],
        "cast", [tensor("x", TensorProto.FLOAT), tensor("s", TensorProto.STRING)],
        [tensor("label", TensorProto.STRING), tensor("z", TensorProto.FLOAT)],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    model = _cast_model(tmp_path_factory.mktemp("models") / "cast.onnx")
    cfg = {
        "listeners": [
            {"name": "main", "host": "127.0.0.1", "port": 0},
            {"name": "grpc", "protocol": "grpc", "host": "127.0.0.1", "port": 0},
        ],
        "backends": {"cast": {"kind": "onnxruntime", "model": str(model), "task": "tensor",
                              "served_name": "cast", "providers": ["CPUExecutionProvider"]}},
        "routes": [
            {"name": "cast", "match": {"prefix": "/v2/models/cast"}, "protocol": "v2",
             "backend": "cast"},
            {"name": "grpc-cast", "match": {"prefix": GRPC_PREFIX}, "protocol": "grpc",
             "backend": "cast"},
        ],
    }  # fmt: skip
    server = ServerThread(lambda: build_app(Settings.model_validate(cfg))).start()
    # (before: its warm-up raised KeyError('STRING'), and the model stayed "warmup" for good,
    # with no error in /readyz and a 500 text/plain for every request)
    wait_ready(server.url, timeout=60)
    yield server
    server.stop()


def _inputs(mod: Any) -> list[Any]:
    x = mod.InferInput("x", [2, 1], "FP32")
    x.set_data_from_numpy(np.array([[1.5], [-2.0]], np.float32))
    s = mod.InferInput("s", [2, 1], "BYTES")
    s.set_data_from_numpy(np.array([[b"2.5"], [b"-7"]], dtype=object))
    return [x, s]


@pytest.mark.parametrize("mod", [httpclient, grpcclient], ids=["http", "grpc"])
def test_string_tensors_in_and_out(gw: ServerThread, mod: Any) -> None:
    c = (
        client(gw)
        if mod is grpcclient
        else mod.InferenceServerClient(gw.url.removeprefix("http://"))
    )
    got = c.infer("cast", _inputs(mod))
    assert got.as_numpy("label").reshape(-1).tolist() == [b"1.5", b"-2"]
    np.testing.assert_array_equal(got.as_numpy("z"), [[2.5], [-7.0]])


def test_string_tensors_as_json(gw: ServerThread) -> None:
    status, doc = http(
        "POST",
        f"{gw.url}/v2/models/cast/infer",
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [0.25]},
                    {"name": "s", "datatype": "BYTES", "shape": [1, 1], "data": ["4"]}]},
    )  # fmt: skip
    assert status == 200, doc
    outputs = {o["name"]: o for o in doc["outputs"]}
    assert outputs["label"] == {"name": "label", "datatype": "BYTES", "shape": [1, 1],
                                "data": ["0.25"]}  # fmt: skip
    assert outputs["z"]["data"] == [4.0]
    status, meta = http("GET", f"{gw.url}/v2/models/cast")
    assert {t["name"]: t["datatype"] for t in meta["inputs"] + meta["outputs"]} == {
        "x": "FP32", "s": "BYTES", "label": "BYTES", "z": "FP32"
    }  # fmt: skip


def test_a_string_that_is_not_utf8_is_a_400(gw: ServerThread) -> None:
    c = httpclient.InferenceServerClient(gw.url.removeprefix("http://"))
    inputs = _inputs(httpclient)
    inputs[1].set_data_from_numpy(np.array([[b"\xff"], [b"1"]], dtype=object))
    with pytest.raises(Exception, match="input 's' must hold UTF-8 strings"):
        c.infer("cast", inputs)
