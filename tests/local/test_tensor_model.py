"""A tensor model (no text): v2 tensors checked against the ONNX graph, images preprocessed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from backends.preprocess.cpu import images_to_nchw
from backends.settings import ImagePreprocess
from gateway.app import build_app
from gateway.config import Settings
from tests.local.conftest import http, wait_ready
from tests.local.test_preprocess import png
from tests.support.servers import ServerThread


def channel_means_model(path: Path) -> None:
    """pixel_values [N, 3, H, W] → channel_means [N, 3]: a real ONNX graph, built in place."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["N", 3, "H", "W"])
    y = helper.make_tensor_value_info("channel_means", TensorProto.FLOAT, ["N", 3])
    node = helper.make_node("ReduceMean", ["pixel_values"], ["channel_means"], axes=[2, 3],
                            keepdims=0)  # fmt: skip
    graph = helper.make_graph([node], "means", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def tensor_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    path = tmp_path_factory.mktemp("models") / "means.onnx"
    channel_means_model(path)
    common = {"kind": "onnxruntime", "model": str(path), "task": "tensor",
              "providers": ["CPUExecutionProvider"]}  # fmt: skip
    cfg = {
        "backends": {
            "means": {**common, "served_name": "means"},
            "vision": {**common, "served_name": "vision",
                       "preprocess": {"kind": "image", "size": [16, 16]}},
        },
        "routes": [
            {"name": "means", "match": {"prefix": "/v2/models/means"}, "protocol": "v2",
             "backend": "means"},
            {"name": "vision", "match": {"prefix": "/v2/models/vision"}, "protocol": "v2",
             "backend": "vision"},
        ],
    }  # fmt: skip
    settings = Settings.model_validate(cfg)
    server = ServerThread(lambda: build_app(settings)).start()
    wait_ready(server.url)
    yield server
    server.stop()


def _client(gw: ServerThread) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(url=gw.url.removeprefix("http://"))


def test_images_through_tritonclient(tensor_gateway: ServerThread) -> None:
    images = [png(40, 30, s) for s in range(3)]
    inp = httpclient.InferInput("pixel_values", [3], "BYTES")
    inp.set_data_from_numpy(np.asarray(images, dtype=object))
    got = _client(tensor_gateway).infer("vision", [inp]).as_numpy("channel_means")
    expected = images_to_nchw(images, ImagePreprocess(size=(16, 16))).mean(axis=(2, 3))
    assert got.shape == (3, 3) and np.allclose(got, expected, atol=1e-5)


def test_raw_tensors_through_tritonclient(tensor_gateway: ServerThread) -> None:
    x = np.random.default_rng(0).random((2, 3, 4, 5), dtype=np.float32)
    inp = httpclient.InferInput("pixel_values", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    got = _client(tensor_gateway).infer("means", [inp]).as_numpy("channel_means")
    assert np.allclose(got, x.mean(axis=(2, 3)), atol=1e-6)


def _infer(gw: ServerThread, model: str, inp: dict[str, Any]) -> tuple[int, Any]:
    return http("POST", f"{gw.url}/v2/models/{model}/infer", {"inputs": [inp]})


@pytest.mark.parametrize(
    ("model", "inp", "message"),
    [
        ("means", {"name": "pixels", "datatype": "FP32", "shape": [1], "data": [1.0]},
         "model means has no input 'pixels' (it takes pixel_values)"),
        ("means", {"name": "pixel_values", "datatype": "INT64", "shape": [1, 3, 1, 1],
                   "data": [1, 2, 3]}, "input 'pixel_values' must be FP32, got INT64"),
        ("means", {"name": "pixel_values", "datatype": "FP32", "shape": [1, 3],
                   "data": [1.0, 2.0, 3.0]}, "has shape [1, 3]; the model takes [-1, 3, -1, -1]"),
        ("vision", {"name": "pixel_values", "datatype": "BYTES", "shape": [1],
                    "data": ["not an image"]}, "image could not be decoded"),
        # no images: the CPU path answered 200 with no rows, the GPU path 500 (torch.stack
        # of nothing); the check comes before either
        ("vision", {"name": "pixel_values", "datatype": "BYTES", "shape": [0], "data": []},
         "input 'pixel_values' holds no images"),
    ],
)  # fmt: skip
def test_bad_tensors_are_400s(
    tensor_gateway: ServerThread, model: str, inp: dict[str, Any], message: str
) -> None:
    status, body = _infer(tensor_gateway, model, inp)
    assert status == 400, body
    assert message in body["error"]


def test_metadata_lists_the_graph_tensors(tensor_gateway: ServerThread) -> None:
    meta = _client(tensor_gateway).get_model_metadata("means")
    assert meta["inputs"] == [
        {"name": "pixel_values", "datatype": "FP32", "shape": [-1, 3, -1, -1]}
    ]
    assert meta["platform"] == "onnxruntime_onnx"
