"""A local model's v2 infer, cold and warm, for requests the key once read unlike the engine.

Through a real gateway (HTTP and gRPC listeners, the exact cache on), with urllib and the real
tritonclient package's gRPC stubs:
- the model and version are segments of the path as sent: the engine reads
  `/v2/models/m%2Fversions%2F1/infer` as a model `m%2Fversions%2F1` it does not serve (404), and
  `.../versions/%31/infer` as a version `%31`, but the key read the decoded path, model m's
  version 1: a 404 cold became m's 200 once m's answer was cached;
- a numeric tensor of a shape with a 0 beside a huge dimension holds no element, but numpy
  refuses to shape it ("array is too big"): a 500 over HTTP (in OpenAI's error envelope) and
  UNKNOWN over gRPC, instead of a 400 / INVALID_ARGUMENT naming the input.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb2
from tritonclient.grpc import service_pb2_grpc as pb2_grpc

from gateway.app import build_app
from gateway.config import Settings
from tests.grpc.conftest import GRPC_PREFIX, grpc_port
from tests.local.conftest import local_config, wait_ready
from tests.support.servers import ServerThread

MODEL = "all-MiniLM-L6-v2"
EXACT = {"exact": {"enabled": True, "tiers": ["memory"]}}


@pytest.fixture(scope="module")
def gw() -> Iterator[ServerThread]:
    cfg: dict[str, Any] = local_config()
    cfg["listeners"] = [
        {"name": "main", "host": "127.0.0.1", "port": 0},
        {"name": "grpc", "protocol": "grpc", "host": "127.0.0.1", "port": 0},
    ]
    for route in cfg["routes"]:
        if route["name"] == "local-v2":
            route["cache"] = EXACT
    cfg["routes"].insert(0, {"name": "grpc-local-v2", "protocol": "grpc", "backend": "minilm",
                             "match": {"prefix": GRPC_PREFIX, "model": MODEL},
                             "cache": EXACT})  # fmt: skip
    server = ServerThread(lambda: build_app(Settings.model_validate(cfg))).start()
    wait_ready(server.url)
    yield server
    server.stop()


def _post(gw: ServerThread, path: str, doc: dict[str, Any]) -> tuple[int, str | None, Any]:
    """status, X-Cache and the answer (JSON, or the raw bytes); the path goes as written."""
    req = urllib.request.Request(gw.url + path, data=json.dumps(doc).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            status, xcache, raw = resp.status, resp.headers.get("x-cache"), resp.read()
    except urllib.error.HTTPError as err:
        status, xcache, raw = err.code, err.headers.get("x-cache"), err.read()
    try:
        return status, xcache, json.loads(raw)
    except ValueError:
        return status, xcache, raw


def _text_doc() -> dict[str, Any]:
    text = f"encoded path {uuid.uuid4().hex}"
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]}


@pytest.mark.parametrize(
    "path",
    [f"/v2/models/{MODEL}%2Fversions%2F1/infer", f"/v2/models/{MODEL}/versions/%31/infer"],
    ids=["slash-in-name", "encoded-version"],
)
def test_an_encoded_model_path_gets_the_engines_answer_cold_and_warm(
    gw: ServerThread, path: str
) -> None:
    doc = _text_doc()
    cold = _post(gw, path, doc)
    assert cold[0] == 404 and isinstance(cold[2], dict) and "error" in cold[2], cold
    plain = _post(gw, f"/v2/models/{MODEL}/versions/1/infer", doc)
    assert (plain[0], plain[1]) == (200, "miss"), plain
    warm = _post(gw, path, doc)
    assert (warm[0], warm[2]) == (cold[0], cold[2]), warm  # not model 1's cached 200
    again = _post(gw, f"/v2/models/{MODEL}/versions/1/infer", doc)
    assert (again[0], again[1], again[2]) == (200, "hit", plain[2])


HUGE = [0, 1 << 62]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_an_empty_tensor_of_a_huge_shape_is_a_json_400(gw: ServerThread, binary: bool) -> None:
    inp: dict[str, Any] = {"name": "text", "datatype": "FP32", "shape": HUGE}
    path = f"/v2/models/{MODEL}/infer"
    if binary:
        header = json.dumps({"inputs": [{**inp, "parameters": {"binary_data_size": 0}}]}).encode()
        req = urllib.request.Request(gw.url + path, data=header, method="POST", headers={
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(header)),
        })  # fmt: skip
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                status, answer = resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            status, answer = err.code, json.loads(err.read())
    else:
        status, _, answer = _post(gw, path, {"inputs": [{**inp, "data": []}]})
    assert status == 400, (status, answer)
    assert isinstance(answer["error"], str) and "'text'" in answer["error"], answer


def test_an_empty_tensor_of_a_huge_shape_is_invalid_argument_over_grpc(gw: ServerThread) -> None:
    msg = pb2.ModelInferRequest(model_name=MODEL)
    msg.inputs.add(name="text", datatype="FP32", shape=HUGE)
    msg.raw_input_contents.append(b"")
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port(gw)}") as channel:
        stub = pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(msg, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
    assert "'text'" in (err.value.details() or "")
