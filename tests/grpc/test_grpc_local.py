"""tritonclient.grpc against the local MiniLM: the same embeddings as HTTP v2, cached on repeat."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from gateway.app import build_app
from gateway.config import Settings
from gateway.grpc.proto import pb2
from tests.grpc.conftest import GRPC_PREFIX, client, grpc_port
from tests.local.conftest import SENTENCES, local_config, wait_ready
from tests.support.servers import ServerThread

MODEL = "all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def gw() -> Iterator[ServerThread]:
    cfg: dict[str, Any] = local_config()
    cfg["listeners"] = [
        {"name": "main", "host": "127.0.0.1", "port": 0},
        {"name": "grpc", "protocol": "grpc", "host": "127.0.0.1", "port": 0},
    ]
    cfg["routes"].insert(
        0,
        {
            "name": "grpc-local-v2",
            "match": {"prefix": GRPC_PREFIX, "model": MODEL},
            "protocol": "grpc",
            "backend": "minilm",
            "cache": {"exact": {"enabled": True, "tiers": ["memory"]}},
        },
    )
    server = ServerThread(lambda: build_app(Settings.model_validate(cfg))).start()
    wait_ready(server.url)
    yield server
    server.stop()


def _text(texts: list[str], mod: Any = grpcclient) -> Any:
    inp = mod.InferInput("text", [len(texts)], "BYTES")
    inp.set_data_from_numpy(np.asarray(texts, dtype=object))
    return inp


def test_infer_equals_http_v2_and_repeats_hit(gw: ServerThread) -> None:
    http = httpclient.InferenceServerClient(gw.url.removeprefix("http://"))
    want = http.infer(MODEL, [_text(SENTENCES[:3], httpclient)]).as_numpy("embedding")
    c = client(gw)
    first = c.infer(MODEL, [_text(SENTENCES[:3])], request_id="a")
    got = first.as_numpy("embedding")
    assert got.shape == (3, 384) and got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    assert first.get_response().id == "a"
    # A repeat is a hit (the response callback sees the initial metadata).
    seen: list[Any] = []
    req = pb2.ModelInferRequest(model_name=MODEL, id="b")
    t = req.inputs.add(name="text", datatype="BYTES", shape=[3])
    t.contents.bytes_contents.extend(s.encode() for s in SENTENCES[:3])
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port(gw)}") as ch:
        rpc = ch.unary_unary(
            GRPC_PREFIX + "ModelInfer",
            request_serializer=pb2.ModelInferRequest.SerializeToString,
            response_deserializer=pb2.ModelInferResponse.FromString,
        )
        resp, call = rpc.with_call(req, timeout=30)
        seen.append(dict(call.initial_metadata())["x-cache"])
    assert seen == ["hit"]  # typed contents and raw contents of the same tensor share a key
    assert resp.id == "b"
    np.testing.assert_array_equal(
        np.frombuffer(resp.raw_output_contents[0], "<f4").reshape(3, 384), want
    )


def test_health_metadata_and_config(gw: ServerThread) -> None:
    c = client(gw)
    assert c.is_server_live() and c.is_server_ready() and c.is_model_ready(MODEL)
    meta = c.get_model_metadata(MODEL, as_json=True)
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": ["-1"]}]
    assert meta["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": ["-1", "384"]}]
    cfg = c.get_model_config(MODEL).config
    assert cfg.name == MODEL and cfg.platform == "onnxruntime_onnx"
    assert cfg.backend == "onnxruntime"  # as Triton fills it beside the platform
    assert cfg.version_policy.latest.num_versions == 1  # version "1", the only one served
    assert [(i.name, i.data_type, list(i.dims)) for i in cfg.input] == [("text", 13, [-1])]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 2000


def test_bad_input_is_invalid_argument_naming_the_problem(gw: ServerThread) -> None:
    c = client(gw)
    with pytest.raises(InferenceServerException) as err:
        c.infer(MODEL, [_text(["many " * 300])])
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "at most 256" in err.value.message()
    wrong = grpcclient.InferInput("texts", [1], "BYTES")
    wrong.set_data_from_numpy(np.asarray(["a"], dtype=object))
    with pytest.raises(InferenceServerException) as err:
        c.infer(MODEL, [wrong])
    assert (
        err.value.status() == "StatusCode.INVALID_ARGUMENT" and "got texts" in err.value.message()
    )
    with pytest.raises(InferenceServerException) as err:
        c.infer("other-model", [_text(["a"])])
    assert err.value.status() == "StatusCode.NOT_FOUND"


@pytest.mark.parametrize("length", ["10", "0", "99999"])
def test_call_metadata_cannot_override_the_translated_v2_headers(
    gw: ServerThread, length: str
) -> None:
    """The gateway writes the v2 body it sends the engine; metadata under the names that
    describe that body is the client's and must not be read in their place."""
    got = client(gw).infer(
        MODEL,
        [_text(SENTENCES[:2])],
        headers={"inference-header-content-length": length, "cache-control": "no-store"},
    )
    assert got.as_numpy("embedding").shape == (2, 384)


def test_a_request_of_many_inputs_is_checked_in_linear_time(gw: ServerThread) -> None:
    """Each input's name was checked against a copy of every input before it: 40,000 inputs
    held a core for minutes. A name twice is found at once now."""
    req = pb2.ModelInferRequest(model_name=MODEL)
    for i in [*range(2047), 0]:
        inp = req.inputs.add(name=f"x{i}", datatype="FP32", shape=[1])
        inp.contents.fp32_contents.append(1.0)
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port(gw)}") as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as err:
            infer(req.SerializeToString(), timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == "input 'x0' appears more than once"


def test_a_request_naming_more_tensors_than_the_route_takes_is_refused(gw: ServerThread) -> None:
    """Past limits.max_items named tensors, RESOURCE_EXHAUSTED before any is read (as the
    HTTP route's 413)."""
    req = pb2.ModelInferRequest(model_name=MODEL)
    for i in range(40_000):
        req.inputs.add(name=f"x{i}", datatype="FP32", shape=[1]).contents.fp32_contents.append(1)
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port(gw)}") as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as err:
            infer(req.SerializeToString(), timeout=60)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "names 40000 inputs" in (err.value.details() or "")
