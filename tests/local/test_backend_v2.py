"""Open Inference v2 on a local engine through the real tritonclient, and its 400s."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from backends.local.text_encoder import TextEncoder
from gateway.app import build_app
from gateway.config import Settings
from tests.local.conftest import SENTENCES, http, local_config, wait_ready
from tests.support.servers import ServerThread

MODEL = "all-MiniLM-L6-v2"


def _client(gw: ServerThread) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(url=gw.url.removeprefix("http://"))


def _text_input(texts: list[str], binary: bool) -> httpclient.InferInput:
    inp = httpclient.InferInput("text", [len(texts)], "BYTES")
    inp.set_data_from_numpy(np.asarray(texts, dtype=object), binary_data=binary)
    return inp


@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_infer_equals_encode(
    local_gateway: ServerThread, encoder: TextEncoder, binary: bool
) -> None:
    client = _client(local_gateway)
    out = httpclient.InferRequestedOutput("embedding", binary_data=binary)
    res = client.infer(MODEL, [_text_input(SENTENCES[:4], binary)], outputs=[out])
    got = res.as_numpy("embedding")
    assert got.shape == (4, 384) and got.dtype == np.float32
    assert np.abs(got - encoder.encode(SENTENCES[:4])).max() < 1e-4


def test_tritonclient_health_metadata_and_ready(local_gateway: ServerThread) -> None:
    client = _client(local_gateway)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(MODEL)
    meta = client.get_model_metadata(MODEL)
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert meta["outputs"][0]["shape"] == [-1, 384]


def _infer_error(gw: ServerThread, inputs: list[dict[str, Any]], model: str = MODEL) -> Any:
    return http("POST", f"{gw.url}/v2/models/{model}/infer", {"inputs": inputs})


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ([{"name": "texts", "datatype": "BYTES", "shape": [1], "data": ["a"]}], "got texts"),
        ([{"name": "text", "datatype": "FP32", "shape": [1], "data": [1.0]}], "must be BYTES"),
        ([{"name": "text", "datatype": "BYTES", "shape": [2, 2], "data": ["a", "b", "c", "d"]}],
         "has shape [2, 2]"),
        ([{"name": "text", "datatype": "BYTES", "shape": [3], "data": ["a"]}],
         "shape [3] needs 3 elements"),
        ([{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["long " * 300]}],
         "tokens; this model takes at most 256"),
    ],
)  # fmt: skip
def test_bad_tensors_are_400s_naming_the_problem(
    local_gateway: ServerThread, inputs: list[dict[str, Any]], message: str
) -> None:
    status, body = _infer_error(local_gateway, inputs)
    assert status == 400
    assert message in body["error"]


def test_tritonclient_sees_the_400_message(local_gateway: ServerThread) -> None:
    inp = httpclient.InferInput("text", [1], "BYTES")
    inp.set_data_from_numpy(np.asarray(["many " * 300], dtype=object))
    with pytest.raises(InferenceServerException, match="at most 256"):
        _client(local_gateway).infer(MODEL, [inp])


def test_unknown_model_is_a_404(local_gateway: ServerThread) -> None:
    inputs = [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}]
    status, body = _infer_error(local_gateway, inputs, model="other-model")
    assert status == 404 and "other-model" in body["error"]


def test_an_unknown_model_version_is_a_404_not_version_1(local_gateway: ServerThread) -> None:
    """A local model has one version, "1": asking for another must not be served as it."""
    client = _client(local_gateway)
    inp = _text_input(SENTENCES[:1], True)
    assert client.infer(MODEL, [inp], model_version="1").as_numpy("embedding").shape == (1, 384)
    with pytest.raises(InferenceServerException) as err:
        client.infer(MODEL, [inp], model_version="2")
    assert "version '2'" in str(err.value)
    assert not client.is_model_ready(MODEL, model_version="7")
    inputs = [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}]
    status, body = http(
        "POST", f"{local_gateway.url}/v2/models/{MODEL}/versions/3/infer", {"inputs": inputs}
    )
    assert status == 404 and "version '3'" in body["error"]


def test_an_input_given_twice_is_a_400(local_gateway: ServerThread) -> None:
    one = {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}
    two = {"name": "text", "datatype": "BYTES", "shape": [2], "data": ["b", "c"]}
    status, body = _infer_error(local_gateway, [one, two])
    # (the protocol adapter refuses it before the local backend's own check)
    assert status == 400 and "'text' appears more than once" in body["error"]


@pytest.fixture(scope="module")
def passthrough_gateway() -> Iterator[ServerThread]:
    """The v2 route as passthrough: no protocol adapter reads the body before the engine."""
    cfg = local_config()
    for route in cfg["routes"]:
        if route["name"] == "local-v2":
            route["protocol"] = "passthrough"
    server = ServerThread(lambda: build_app(Settings.model_validate(cfg))).start()
    wait_ready(server.url)
    yield server
    server.stop()


def test_input_parameters_not_an_object_are_a_400_on_a_passthrough_route(
    passthrough_gateway: ServerThread,
) -> None:
    """The engine checks what the v2 adapter checks on its own: before, a list as an input's
    'parameters' was an AttributeError in the codec, a text/plain 500."""
    inputs = [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"], "parameters": [1]}]
    status, body = _infer_error(passthrough_gateway, inputs)
    assert status == 400 and "'parameters' must be an object" in str(body["error"])
    client = _client(passthrough_gateway)  # and the route serves a well-formed request
    assert client.infer(MODEL, [_text_input(["a"], True)]).as_numpy("embedding").shape == (1, 384)
