"""Large v2 tensors on a local model (an ONNX Identity on ONNX Runtime): writing megabytes of JSON
numbers, or reading typed gRPC contents, never holds the event loop, so /healthz keeps being
answered meanwhile; and the numbers are the ones sent."""

from __future__ import annotations

import json
import re
import select
import socket
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2_grpc as pb2_grpc

from gateway.app import build_app
from gateway.config import Settings
from gateway.grpc import GRPC
from gateway.grpc.proto import pb2
from tests.grpc.conftest import GRPC_PREFIX, grpc_port
from tests.local.conftest import http, wait_ready
from tests.support.servers import ServerThread

# Elements of the large tensors: 16 MB of FP32 or INT32.
N = 4_000_000
# The tiling model's factor: 1,000 floats in, N out.
TILES = N // 1000


def _model(path: Path, kind: int, op: str) -> Path:
    """For x [rows, n] of one element type: y = x (Identity), y = x tiled TILES times along n
    (Tile), or y = the sum of each row, [rows, 1] (ReduceSum)."""
    import onnx
    from onnx import helper

    x = helper.make_tensor_value_info("x", kind, ["rows", "n"])
    y = helper.make_tensor_value_info("y", kind, ["rows", "m"])
    if op == "Identity":
        nodes, init = [helper.make_node("Identity", ["x"], ["y"])], []
    else:
        arg = [1, TILES] if op == "Tile" else [1]
        init = [helper.make_tensor("arg", onnx.TensorProto.INT64, [len(arg)], arg)]
        extra = {"keepdims": 1} if op == "ReduceSum" else {}
        nodes = [helper.make_node(op, ["x", "arg"], ["y"], **extra)]
    graph = helper.make_graph(nodes, op.lower(), [x], [y], initializer=init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    from onnx import TensorProto

    models = tmp_path_factory.mktemp("models")

    def backend(name: str, kind: int, op: str) -> dict[str, Any]:
        model = _model(models / f"{name}.onnx", kind, op)
        return {"kind": "onnxruntime", "model": str(model), "task": "tensor",
                "served_name": name, "providers": ["CPUExecutionProvider"]}  # fmt: skip

    def grpc_route(model: str) -> dict[str, Any]:
        return {"name": f"grpc-{model}", "match": {"prefix": GRPC_PREFIX, "model": model},
                "protocol": "grpc", "backend": model}  # fmt: skip

    cfg = {
        "listeners": [
            {"name": "main", "host": "127.0.0.1", "port": 0},
            {"name": "grpc", "protocol": "grpc", "host": "127.0.0.1", "port": 0},
        ],
        "backends": {"tiles": backend("tiles", TensorProto.FLOAT, "Tile"),
                     "sums": backend("sums", TensorProto.INT32, "ReduceSum"),
                     "floats": backend("floats", TensorProto.FLOAT, "Identity")},
        "routes": [
            {"name": "tiles", "match": {"prefix": "/v2/models/tiles"}, "protocol": "v2",
             "backend": "tiles"},
            grpc_route("sums"), grpc_route("floats"),
        ],
    }  # fmt: skip
    server = ServerThread(lambda: build_app(Settings.model_validate(cfg))).start()
    wait_ready(server.url)
    yield server
    server.stop()


def _healthz_answers_between(
    gw: ServerThread, start: Callable[[], bool], stop: Callable[[], bool]
) -> int:
    """/healthz answers counted once start() holds, until stop() does."""
    while not start():
        pass
    answered = 0
    while not stop():
        status, _ = http("GET", f"{gw.url}/healthz")
        assert status == 200
        answered += 1
    return answered


def _engine_runs(gw: ServerThread, model: str) -> int:
    """How many times the model's engine has run (the count its batcher records as it ends)."""
    _, text = http("GET", f"{gw.url}/metrics")
    found = re.search(rf'latentgate_engine_run_seconds_count{{model="{model}"}} (\S+)', str(text))
    return int(float(found.group(1))) if found else 0


def test_healthz_answers_while_a_large_output_is_written_as_json(gw: ServerThread) -> None:
    """1,000 floats in, one row of 4M out, asked for as JSON: json.dumps took 2-4 s on the
    event loop (the worker thread was only used past 64 rows), and /healthz waited all along.
    Counted from the engine's run to the answer's first byte: the JSON is written meanwhile."""
    x = np.random.default_rng(7).standard_normal((1, 1000)).astype(np.float32)
    x[0, :6] = [np.nan, np.inf, -np.inf, -0.0, np.float32(1e-45), np.finfo(np.float32).max]
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1000],
                                   "data": x.reshape(-1).tolist()}]}).encode()  # fmt: skip
    runs = _engine_runs(gw, "tiles")
    host, port = gw.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=300) as sock:
        sock.sendall(
            b"POST /v2/models/tiles/infer HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        )
        answered = _healthz_answers_between(
            gw,
            lambda: _engine_runs(gw, "tiles") > runs,
            lambda: bool(select.select([sock], [], [], 0)[0]),
        )
        answer = b"".join(iter(lambda: sock.recv(1 << 20), b""))
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    out = json.loads(payload)["outputs"][0]
    assert out["shape"] == [1, N] and out["datatype"] == "FP32"
    y = np.asarray(out["data"], np.float32)
    assert np.array_equal(y.view(np.uint32), np.tile(x, (1, TILES)).reshape(-1).view(np.uint32))
    assert answered >= 10, answered


def test_healthz_answers_while_typed_grpc_contents_are_read(gw: ServerThread) -> None:
    """8M INT32 values in int_contents (one byte each on the wire: 8 MB), summed to one number:
    list() of the repeated field then np.asarray held the event loop, and /healthz, for 1-2 s.
    Counted from the call's start in the gateway to the engine's run: the contents are read
    meanwhile."""
    assert gw.app is not None
    service = gw.app[GRPC].service
    x = np.random.default_rng(8).integers(0, 128, (1, 2 * N), dtype=np.int32)
    msg = pb2.ModelInferRequest(model_name="sums")
    inp = msg.inputs.add(name="x", datatype="INT32", shape=[1, 2 * N])
    inp.contents.int_contents.extend(x.reshape(-1).tolist())
    runs = _engine_runs(gw, "sums")
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port(gw)}") as channel:
        future = pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer.future(msg, timeout=300)
        answered = _healthz_answers_between(
            gw,
            lambda: service.in_flight > 0 or future.done(),  # the gateway has the message
            lambda: _engine_runs(gw, "sums") > runs or future.done(),
        )
        reply = future.result()
    assert list(reply.outputs[0].shape) == [1, 1]
    assert np.frombuffer(reply.raw_output_contents[0], "<i4").tolist() == [int(x.sum())]
    assert answered > 4, answered  # 3-4 before (the loop held); 9-30 since, on a loaded machine


def test_typed_fp32_contents_arrive_bit_for_bit_over_grpc(gw: ServerThread) -> None:
    """fp32_contents are read as the packed bytes they travel as: the same tensor as before,
    NaN, infinities, -0.0 and subnormals included."""
    x = np.random.default_rng(9).standard_normal((2, 1000)).astype(np.float32)
    x[0, :6] = [np.nan, np.inf, -np.inf, -0.0, np.float32(1e-45), np.finfo(np.float32).max]
    msg = pb2.ModelInferRequest(model_name="floats")
    inp = msg.inputs.add(name="x", datatype="FP32", shape=[2, 1000])
    inp.contents.fp32_contents.extend(x.reshape(-1).tolist())
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port(gw)}") as channel:
        reply = pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(msg, timeout=60)
    y = np.frombuffer(reply.raw_output_contents[0], np.float32)
    assert np.array_equal(y.view(np.uint32), x.reshape(-1).view(np.uint32))


def test_a_typed_value_out_of_range_is_still_invalid_argument(gw: ServerThread) -> None:
    msg = pb2.ModelInferRequest(model_name="sums")
    inp = msg.inputs.add(name="x", datatype="INT32", shape=[1, 2])
    inp.contents.int_contents.extend([1, 2])
    bad = pb2.ModelInferRequest(model_name="sums")
    bad.inputs.add(name="x", datatype="INT8", shape=[1, 2]).contents.int_contents.extend([1, 300])
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port(gw)}") as channel:
        stub = pb2_grpc.GRPCInferenceServiceStub(channel)
        reply = stub.ModelInfer(msg, timeout=60)
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(bad, timeout=60)
    assert reply.raw_output_contents[0] == struct.pack("<i", 3)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'x'" in (err.value.details() or "")
