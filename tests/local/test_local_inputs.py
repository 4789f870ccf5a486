"""What a local model takes, the same whether the exact cache has the answer or not.

Through a real gateway (HTTP and gRPC listeners, the exact cache on) with the real tritonclient
and openai packages: a request the cache keys like an earlier one (msgpack and its JSON twin,
`dimensions: 384.0` and `384`) gets that one's outcome cold and warm; an output parameter the
local codec does not honour (the classification extension's class_count) is refused, never
answered with the raw tensor, and no cached answer of a plain request serves it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from gateway.app import build_app
from gateway.config import Settings
from tests.grpc.conftest import GRPC_PREFIX, client
from tests.local.conftest import local_config, wait_ready
from tests.support.servers import ServerThread

MODEL = "all-MiniLM-L6-v2"
INFER = f"/v2/models/{MODEL}/infer"
EXACT = {"exact": {"enabled": True, "tiers": ["memory"]}}


@pytest.fixture(scope="module")
def gw() -> Iterator[ServerThread]:
    cfg: dict[str, Any] = local_config()
    cfg["listeners"] = [
        {"name": "main", "host": "127.0.0.1", "port": 0},
        {"name": "grpc", "protocol": "grpc", "host": "127.0.0.1", "port": 0},
    ]
    for route in cfg["routes"]:
        if route["name"] in ("local-embeddings", "local-v2"):
            route["cache"] = EXACT
    cfg["routes"].insert(0, {"name": "grpc-local-v2", "protocol": "grpc", "backend": "minilm",
                             "match": {"prefix": GRPC_PREFIX, "model": MODEL},
                             "cache": EXACT})  # fmt: skip
    server = ServerThread(lambda: build_app(Settings.model_validate(cfg))).start()
    wait_ready(server.url)
    yield server
    server.stop()


def _unique(label: str) -> str:
    """A text no other test (or earlier run's cache) has seen: each test starts cold."""
    return f"{label} {uuid.uuid4().hex}"


def _post(gw: ServerThread, path: str, body: bytes, ctype: str) -> tuple[int, str | None, Any]:
    """status, X-Cache and the JSON answer (or the raw bytes when it is not JSON)."""
    req = urllib.request.Request(gw.url + path, data=body, method="POST",
                                 headers={"Content-Type": ctype})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            status, xcache, raw = resp.status, resp.headers.get("x-cache"), resp.read()
    except urllib.error.HTTPError as err:
        status, xcache, raw = err.code, err.headers.get("x-cache"), err.read()
    try:
        return status, xcache, json.loads(raw)
    except ValueError:
        return status, xcache, raw


def _as_json(doc: Any) -> tuple[bytes, str]:
    return json.dumps(doc).encode(), "application/json"


def _as_msgpack(doc: Any) -> tuple[bytes, str]:
    return msgpack.packb(doc), "application/msgpack"


def _v2_doc(text: str, as_bin: bool = False) -> dict[str, Any]:
    data: Any = [text.encode() if as_bin else text]
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": data}]}


# ---- one outcome, cold or warm ----


@pytest.mark.parametrize("path", ["/v1/embeddings", INFER])
def test_msgpack_and_its_json_twin_get_one_outcome_cold_and_warm(
    gw: ServerThread, path: str
) -> None:
    """Either form first: the cold one's answer is the warm one's, and a 200 both times."""
    for first, second in ((_as_msgpack, _as_json), (_as_json, _as_msgpack)):
        text = _unique("msgpack twin")
        doc = {"model": MODEL, "input": text} if path == "/v1/embeddings" else _v2_doc(text)
        cold = _post(gw, path, *first(doc))
        warm = _post(gw, path, *second(doc))
        assert (cold[0], cold[1]) == (200, "miss"), cold
        assert (warm[0], warm[1], warm[2]) == (200, "hit", cold[2]), warm


@pytest.mark.parametrize("path", ["/v1/embeddings", INFER])
@pytest.mark.parametrize(
    "odd", [msgpack.Timestamp(1, 0), msgpack.ExtType(5, b"x")], ids=["timestamp", "ext"]
)
def test_msgpack_extension_types_are_a_json_400(gw: ServerThread, path: str, odd: Any) -> None:
    """No JSON twin, so no key: a Timestamp anywhere in the body was a 500 (review)."""
    text = _unique("ext")
    if path == "/v1/embeddings":
        docs = [
            {"model": MODEL, "input": text, "dimensions": odd},
            {"model": MODEL, "input": [odd]},
        ]
    else:
        doc = _v2_doc(text)
        docs = [{**doc, "parameters": {"at": odd}}, {**doc, "id": odd}]
    for d in docs:
        status, _, answer = _post(gw, path, msgpack.packb(d), "application/msgpack")
        assert status == 400, (status, answer)
        assert "extension types" in json.dumps(answer)


def test_msgpack_bin_strings_are_the_same_v2_text(gw: ServerThread) -> None:
    """msgpack may carry a BYTES element as bin; the key hashes it as the same string's
    UTF-8, so the engine takes it too, cold, and it equals the JSON answer."""
    text = _unique("bin element")
    cold = _post(gw, INFER, *_as_msgpack(_v2_doc(text, as_bin=True)))
    assert (cold[0], cold[1]) == (200, "miss"), cold
    warm = _post(gw, INFER, *_as_json(_v2_doc(text)))
    assert (warm[0], warm[1], warm[2]) == (200, "hit", cold[2])
    out = cold[2]["outputs"][0]
    assert out["name"] == "embedding" and out["shape"] == [1, 384]


def _sdk_embed(gw: ServerThread, text: str, dimensions: Any) -> tuple[str | None, list[float]]:
    with openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0) as sdk:
        raw = sdk.embeddings.with_raw_response.create(
            model=MODEL, input=text, dimensions=dimensions, encoding_format="float"
        )
        return raw.headers.get("x-cache"), raw.parse().data[0].embedding


def test_integral_float_dimensions_get_one_outcome_cold_and_warm(gw: ServerThread) -> None:
    """`dimensions: 384.0` is keyed as 384: either first, both are served, cold and warm."""
    for first, second in ((384.0, 384), (384, 384.0)):
        text = _unique("dimensions")
        cold = _sdk_embed(gw, text, first)
        warm = _sdk_embed(gw, text, second)
        assert cold[0] == "miss" and warm[0] == "hit"
        assert warm[1] == cold[1] and len(cold[1]) == 384
    # a fraction, a bool or another size is refused, though the valid answer is cached
    for dimensions, message in ((384.5, "must be an integer"), (True, "must be an integer"),
                                (128.0, "must be 384")):  # fmt: skip
        with pytest.raises(openai.BadRequestError, match=f"'dimensions' {message}"):
            _sdk_embed(gw, text, dimensions)


# ---- output parameters the local codec does not honour ----


def _http_text(text: str, binary: bool) -> httpclient.InferInput:
    inp = httpclient.InferInput("text", [1], "BYTES")
    inp.set_data_from_numpy(np.asarray([text], dtype=object), binary_data=binary)
    return inp


@pytest.mark.parametrize("binary", [True, False])
def test_class_count_over_http_is_refused_even_after_the_plain_answer_is_cached(
    gw: ServerThread, binary: bool
) -> None:
    triton = httpclient.InferenceServerClient(gw.url.removeprefix("http://"))
    text = _unique("classification http")
    plain = httpclient.InferRequestedOutput("embedding", binary_data=binary)
    want = triton.infer(MODEL, [_http_text(text, binary)], outputs=[plain]).as_numpy("embedding")
    assert want.shape == (1, 384)
    top3 = httpclient.InferRequestedOutput("embedding", binary_data=binary, class_count=3)
    for _ in range(2):  # refused cold, and not stored to be served warm
        with pytest.raises(InferenceServerException, match="'classification'"):
            triton.infer(MODEL, [_http_text(text, binary)], outputs=[top3])
    again = triton.infer(MODEL, [_http_text(text, binary)], outputs=[plain])
    np.testing.assert_array_equal(again.as_numpy("embedding"), want)


@pytest.mark.parametrize(
    ("parameters", "named"),
    [({"classification": 3}, "'classification'"),
     ({"binary_data": False, "shared_memory_region": "r0"}, "'shared_memory_region'")],
)  # fmt: skip
def test_unhonoured_output_parameters_are_a_json_400(
    gw: ServerThread, parameters: dict[str, Any], named: str
) -> None:
    doc = _v2_doc(_unique("output parameters"))
    _post(gw, INFER, *_as_json(doc))  # plain: cached
    doc["outputs"] = [{"name": "embedding", "parameters": parameters}]
    for body in (_as_json(doc), _as_msgpack(doc)):
        status, _, answer = _post(gw, INFER, *body)
        assert status == 400 and isinstance(answer, dict), answer
        assert named in answer["error"], answer


@pytest.mark.parametrize(
    ("where", "parameters", "named"),
    [("output", {"binary_data": "false"}, "output 'embedding': parameter 'binary_data'"),
     ("request", {"binary_data_output": 1}, "'parameters': parameter 'binary_data_output'")],
)  # fmt: skip
def test_a_binary_data_flag_that_is_no_boolean_is_a_json_400(
    gw: ServerThread, where: str, parameters: dict[str, Any], named: str
) -> None:
    """Triton refuses a binary_data flag that is no JSON boolean; the local codec read it as
    Python truth, so `"binary_data": "false"` got the binary extension (200, octet-stream) its
    client, expecting JSON, could not parse."""
    doc = _v2_doc(_unique("binary flag"))
    if where == "output":
        doc["outputs"] = [{"name": "embedding", "parameters": parameters}]
    else:
        doc["parameters"] = parameters
    status, _, answer = _post(gw, INFER, *_as_json(doc))
    assert status == 400 and isinstance(answer, dict), answer
    assert answer["error"].startswith(named), answer


@pytest.mark.parametrize("outputs", [{"name": "embedding"}, "embedding"])
def test_outputs_that_are_no_array_are_a_json_400(gw: ServerThread, outputs: Any) -> None:
    """`"outputs": {"name": ...}` was read as no outputs named, and answered with all of them;
    Triton refuses it."""
    doc = _v2_doc(_unique("outputs not an array"))
    doc["outputs"] = outputs
    status, _, answer = _post(gw, INFER, *_as_json(doc))
    assert status == 400 and isinstance(answer, dict), answer
    assert answer["error"] == "'outputs' must be an array of objects"


def test_an_output_asked_for_twice_is_a_400_not_answered_twice(gw: ServerThread) -> None:
    """Each requested output was answered in full, duplicates too: 50,000 of `embedding` in a
    1 MB body were 40 s of the engine's time and a 400 MB answer. Triton refuses the name
    twice; now the gateway does, over HTTP and (translated to HTTP v2) gRPC."""
    doc = _v2_doc(_unique("outputs twice"))
    doc["outputs"] = [{"name": "embedding"}, {"name": "embedding"}]
    status, _, answer = _post(gw, INFER, *_as_json(doc))
    # before: 200, the embedding twice
    assert status == 400 and isinstance(answer, dict), answer
    assert answer["error"] == "output 'embedding' is requested more than once"
    twice = [grpcclient.InferRequestedOutput("embedding")] * 2
    with pytest.raises(InferenceServerException) as err:
        client(gw).infer(MODEL, [_grpc_text(_unique("outputs twice grpc"))], outputs=twice)
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "requested more than once" in (err.value.message() or "")


def _grpc_text(text: str) -> grpcclient.InferInput:
    inp = grpcclient.InferInput("text", [1], "BYTES")
    inp.set_data_from_numpy(np.asarray([text], dtype=object))
    return inp


def test_class_count_over_grpc_is_invalid_argument_even_after_the_plain_answer_is_cached(
    gw: ServerThread,
) -> None:
    triton = client(gw)
    text = _unique("classification grpc")
    plain = grpcclient.InferRequestedOutput("embedding")
    want = triton.infer(MODEL, [_grpc_text(text)], outputs=[plain]).as_numpy("embedding")
    assert want is not None and want.shape == (1, 384)
    top3 = grpcclient.InferRequestedOutput("embedding", class_count=3)
    for _ in range(2):
        with pytest.raises(InferenceServerException) as err:
            triton.infer(MODEL, [_grpc_text(text)], outputs=[top3])
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "'classification'" in (err.value.message() or "")
    again = triton.infer(MODEL, [_grpc_text(text)], outputs=[plain]).as_numpy("embedding")
    np.testing.assert_array_equal(again, want)


def test_a_header_the_connection_header_nominates_is_not_read_hit_or_miss(
    gw: ServerThread,
) -> None:
    """Connection: Content-Type makes Content-Type hop-by-hop: the engine never gets it, so it
    reads JSON. The key read the body as msgpack all the same, so the request was a 400 cold
    and a 200 hit once its plain twin was cached (review)."""
    import httpx2

    body = msgpack.packb({"model": MODEL, "input": _unique("nominated")})
    plain = {"Content-Type": "application/msgpack"}
    hop = {**plain, "Connection": "keep-alive, Content-Type"}
    with httpx2.Client(base_url=gw.url, timeout=60) as c:
        cold = c.post("/v1/embeddings", content=body, headers=hop)
        assert cold.status_code == 400 and "JSON" in cold.text, cold.text
        stored = c.post("/v1/embeddings", content=body, headers=plain)
        assert (stored.status_code, stored.headers["x-cache"]) == (200, "miss")
        again = c.post("/v1/embeddings", content=body, headers=hop)
        assert (again.status_code, again.json()) == (400, cold.json())
        assert c.post("/v1/embeddings", content=body, headers=plain).headers["x-cache"] == "hit"
