"""`make run`'s config serves the builtin MiniLM locally out of the box; others go upstream."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Callable, Iterator
from http.client import HTTPConnection

import numpy as np
import pytest

from backends.local.text_encoder import TextEncoder
from gateway.app import build_app
from gateway.config import load_settings
from tests.local.conftest import http, wait_ready
from tests.support.servers import ROOT, ServerThread


@pytest.fixture(scope="module")
def default_gateway() -> Iterator[ServerThread]:
    # A bound but never listening socket stands in for a dead remote upstream: connections are
    # refused, and no other server in the suite can take the port while the module runs.
    with socket.socket() as dead:
        dead.bind(("127.0.0.1", 0))
        env = {
            "LATENTGATE_UPSTREAM": f"http://127.0.0.1:{dead.getsockname()[1]}",
            "LATENTGATE_GRPC_UPSTREAM": f"grpc://127.0.0.1:{dead.getsockname()[1]}",
            "LATENTGATE_GRPC_PORT": "0",  # the OS picks: 8001 may be taken on a shared machine
        }
        settings = load_settings(ROOT / "config/latentgate.yaml", environ=env)
        server = ServerThread(lambda: build_app(settings)).start()
        wait_ready(server.url)
        yield server
        server.stop()


def test_embeddings_and_v2_are_local(default_gateway: ServerThread, encoder: TextEncoder) -> None:
    expected = encoder.encode(["hello there"])[0]
    status, doc = http("POST", f"{default_gateway.url}/v1/embeddings",
                       {"model": "all-MiniLM-L6-v2", "input": "hello there"})  # fmt: skip
    assert status == 200
    assert float(np.asarray(doc["data"][0]["embedding"]) @ expected) >= 0.9999
    body = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hello there"]}]
    }
    status, doc = http("POST", f"{default_gateway.url}/v2/models/all-MiniLM-L6-v2/infer", body)
    assert status == 200
    assert float(np.asarray(doc["outputs"][0]["data"]) @ expected) >= 0.9999
    status, doc = http("GET", f"{default_gateway.url}/v2/models/all-MiniLM-L6-v2")
    assert status == 200 and doc["inputs"][0]["datatype"] == "BYTES"


def test_other_models_still_go_to_the_remote_upstream(default_gateway: ServerThread) -> None:
    status, doc = http("POST", f"{default_gateway.url}/v1/embeddings",
                       {"model": "text-embedding-3-small", "input": "hi"})  # fmt: skip
    assert status == 502 and "upstream" in doc["error"]["message"]


def test_local_backend_and_semantic_embedder_share_one_session(
    default_gateway: ServerThread,
) -> None:
    # The default config serves MiniLM as /v1/embeddings and as the semantic cache's embedder:
    # one ONNX Runtime session, not two (memory and warm-up paid once).
    status, text = http("GET", f"{default_gateway.url}/metrics")
    assert status == 200
    loaded = [
        line
        for line in str(text).splitlines()
        if line.startswith('latentgate_engine_sessions_loaded_total{model="all-MiniLM-L6-v2"}')
    ]
    assert loaded and float(loaded[0].split()[-1]) == 1.0


def test_tritonclient_works_unchanged_with_no_upstream(
    default_gateway: ServerThread, encoder: TextEncoder
) -> None:
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    from gateway.version import version

    client = httpclient.InferenceServerClient(default_gateway.url.removeprefix("http://"))
    try:
        # Server-level calls are the gateway's own: they work with the upstream down.
        assert client.is_server_live() and client.is_server_ready()
        meta = client.get_server_metadata()
        assert meta["name"] == "latentgate" and meta["version"] == version()
        assert "binary_tensor_data" in meta["extensions"]
        # The local model answers every model-level call.
        assert client.is_model_ready("all-MiniLM-L6-v2")
        md = client.get_model_metadata("all-MiniLM-L6-v2")
        assert md["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
        assert md["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]}]
        cfg = client.get_model_config("all-MiniLM-L6-v2")
        assert cfg["name"] == "all-MiniLM-L6-v2" and cfg["backend"] == "onnxruntime"
        assert cfg["input"] == [{"name": "text", "data_type": "TYPE_STRING", "dims": [-1]}]
        assert cfg["output"][0]["data_type"] == "TYPE_FP32"
        text = httpclient.InferInput("text", [2], "BYTES")
        text.set_data_from_numpy(np.array([b"hello there", b"general kenobi"], dtype=np.object_))
        got = client.infer("all-MiniLM-L6-v2", [text]).as_numpy("embedding")
        assert got is not None and got.shape == (2, 384)
        want = encoder.encode(["hello there", "general kenobi"])
        assert float(np.min(np.sum(got * want, axis=1))) >= 0.9999
        # A remote model's calls still go to the (dead) upstream.
        with pytest.raises(InferenceServerException) as err:
            client.get_model_metadata("some-remote-model")
        assert err.value.status() == "502"
    finally:
        client.close()


@pytest.mark.parametrize(
    "path", ["/v2/models/all-MiniLM-L6-v2", "/v2/models/all-MiniLM-L6-v2/config"]
)
def test_a_head_of_the_local_models_metadata_is_answered_like_its_get(
    default_gateway: ServerThread, path: str
) -> None:
    # curl -I, a load balancer's HEAD probe: before, the metadata HEAD went past the GET-only
    # route to the (dead) upstream (502), and the config HEAD was a 404 of the local model.
    def ask(method: str) -> tuple[int, str | None, str | None, bytes]:
        conn = HTTPConnection("127.0.0.1", default_gateway.port, timeout=30)
        try:
            conn.request(method, path)
            resp = conn.getresponse()
            got = resp.status, resp.getheader("Content-Type"), resp.getheader("Content-Length")
            return (*got, resp.read())
        finally:
            conn.close()

    get_status, get_type, get_length, get_body = ask("GET")
    head_status, head_type, head_length, head_body = ask("HEAD")
    assert get_status == 200 and json.loads(get_body)["name"] == "all-MiniLM-L6-v2"
    assert (head_status, head_type, head_body) == (200, get_type, b"")
    assert head_length in (None, get_length)


def test_readyz_shows_a_never_reached_upstream_as_not_healthy(
    default_gateway: ServerThread,
) -> None:
    status, doc = http("GET", f"{default_gateway.url}/readyz")
    # Ready: the gateway's own parts (the local engine, the semantic stage) are loaded; the
    # upstream is reported but not required by the default config.
    assert status == 200 and doc["ready"] is True
    assert doc["backends"]["minilm"]["required"] is True
    assert doc["semantic"]["ready"] is True
    upstream = doc["backends"]["upstream"]
    assert upstream["required"] is False and upstream["ready"] is False
    assert all(not r["healthy"] for r in upstream["replicas"])
    assert {r["state"] for r in upstream["replicas"]} <= {"unknown", "unreachable"}


def test_grpc_listener_serves_minilm_and_refuses_a_dead_grpc_upstream(
    default_gateway: ServerThread, encoder: TextEncoder
) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from gateway.grpc import GRPC

    assert default_gateway.app is not None
    port = default_gateway.app[GRPC].ports["grpc"]
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    inp = grpcclient.InferInput("text", [1], "BYTES")
    inp.set_data_from_numpy(np.asarray(["hello there"], dtype=object))
    got = client.infer("all-MiniLM-L6-v2", [inp]).as_numpy("embedding")
    assert float(got[0] @ encoder.encode(["hello there"])[0]) >= 0.9999
    # Other models go to the gRPC upstream pool, which is down here.
    with pytest.raises(InferenceServerException) as err:
        client.infer("resnet", [inp])
    assert err.value.status() == "StatusCode.UNAVAILABLE"
    assert "grpc-upstream" in err.value.message()


def test_text_that_is_not_valid_unicode_and_malformed_parameters_are_a_400(
    default_gateway: ServerThread,
) -> None:
    """JSON lets a lone surrogate ("\\ud800") through; no text has one. And v2 `parameters`
    must be objects. Each is the client's error in its API's format, never a 500."""
    import urllib.error
    import urllib.request

    def post(path: str, raw: bytes) -> tuple[int, dict[str, object]]:
        req = urllib.request.Request(
            default_gateway.url + path, data=raw, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    status, doc = post("/v1/embeddings", b'{"model": "all-MiniLM-L6-v2", "input": "\\ud800abc"}')
    assert status == 400 and "lone surrogate" in json.dumps(doc)
    v2 = "/v2/models/all-MiniLM-L6-v2/infer"

    def text(value: str) -> dict[str, object]:
        return {"name": "text", "datatype": "BYTES", "shape": [1], "data": [value]}

    raw = json.dumps({"inputs": [text("MARK")]}).replace("MARK", "\\ud800")
    status, doc = post(v2, raw.encode())
    assert status == 400 and "lone surrogate" in json.dumps(doc)
    status, doc = post(v2, json.dumps({"inputs": [text("hi")], "parameters": "x"}).encode())
    assert status == 400 and "parameters" in json.dumps(doc)
    outputs = [{"name": "embedding", "parameters": 5}]
    status, doc = post(v2, json.dumps({"inputs": [text("hi")], "outputs": outputs}).encode())
    assert status == 400 and "parameters" in json.dumps(doc)


def test_grpc_applies_the_routes_rows_per_request_limit(default_gateway: ServerThread) -> None:
    """Over HTTP 2,049 texts are a 413; over gRPC the same request is RESOURCE_EXHAUSTED, not
    2,049 embeddings computed past the limit."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from gateway.grpc import GRPC

    assert default_gateway.app is not None
    port = default_gateway.app[GRPC].ports["grpc"]
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    inp = grpcclient.InferInput("text", [2049], "BYTES")
    inp.set_data_from_numpy(np.asarray(["hi"] * 2049, dtype=object))
    with pytest.raises(InferenceServerException) as err:
        client.infer("all-MiniLM-L6-v2", [inp])
    assert err.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "at most 2048" in err.value.message()
    ok = grpcclient.InferInput("text", [2], "BYTES")
    ok.set_data_from_numpy(np.asarray(["hi", "there"], dtype=object))
    assert client.infer("all-MiniLM-L6-v2", [ok]).as_numpy("embedding").shape == (2, 384)


def _items_embedded(url: str) -> float:
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("latentgate_batch_size_sum{")
    )


async def test_work_for_a_client_that_hung_up_is_dropped(default_gateway: ServerThread) -> None:
    """Three clients send 2,048 texts each and give up at once: the engine must not embed
    their 6,144 texts (minutes on a CPU) before answering the next client."""
    import aiohttp

    url = default_gateway.url
    before = _items_embedded(url)
    timeout = aiohttp.ClientTimeout(total=0.3)
    async with aiohttp.ClientSession(timeout=timeout) as s:

        async def abandon(k: int) -> None:
            texts = [f"abandoned request {k} text number {i}" for i in range(2048)]
            body = {"model": "all-MiniLM-L6-v2", "input": texts}
            with contextlib.suppress(TimeoutError):
                async with s.post(url + "/v1/embeddings", json=body) as r:
                    await r.read()

        await asyncio.gather(*(abandon(k) for k in range(3)))
    async with aiohttp.ClientSession() as s:
        body = {"model": "all-MiniLM-L6-v2", "input": "the client after them"}
        async with s.post(url + "/v1/embeddings", json=body) as r:
            assert r.status == 200
    done = _items_embedded(url) - before
    # what was already in a running batch is finished; the rest of the queue is not
    assert done < 2048, done


async def test_a_leader_that_hangs_up_hands_its_flight_to_a_waiter(
    default_gateway: ServerThread,
) -> None:
    """Two clients ask for the same 2,048 embeddings (one flight); the first gives up. The
    second, still connected, gets its answer: a waiter takes the flight over (it used to get
    the first client's 499)."""
    import aiohttp

    url = default_gateway.url
    texts = [f"a shared request, text number {i}" for i in range(2048)]
    body = {"model": "all-MiniLM-L6-v2", "input": texts}
    async with aiohttp.ClientSession() as s:

        async def leader() -> None:
            quick = aiohttp.ClientTimeout(total=0.4)
            with contextlib.suppress(TimeoutError):
                async with s.post(url + "/v1/embeddings", json=body, timeout=quick) as r:
                    await r.read()

        async def waiter() -> tuple[int, object]:
            await asyncio.sleep(0.1)  # the leader's flight is open
            async with s.post(url + "/v1/embeddings", json=body) as r:
                return r.status, await r.json()

        _, (status, doc) = await asyncio.gather(leader(), waiter())
    assert status == 200, doc
    assert isinstance(doc, dict) and len(doc["data"]) == 2048


def test_request_metrics_name_the_route_the_model_chose(default_gateway: ServerThread) -> None:
    """/v1/embeddings for another model goes upstream on `openai-embeddings` (here a dead
    upstream: a 502): the request is counted there, not on `local-embeddings` before it."""
    import urllib.request

    def count(route: str, status: str) -> float:
        with urllib.request.urlopen(default_gateway.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("latentgate_requests_total{")
            and f'route="{route}"' in line
            and f'status="{status}"' in line
        )

    before = count("openai-embeddings", "502"), count("local-embeddings", "502")
    status, _ = http(
        "POST",
        default_gateway.url + "/v1/embeddings",
        {"model": "text-embedding-3-small", "input": "counted where it went"},
    )
    assert status == 502
    after = count("openai-embeddings", "502"), count("local-embeddings", "502")
    assert (after[0] - before[0], after[1] - before[1]) == (1, 0)


async def test_a_model_no_route_takes_is_counted_on_no_route(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """Two routes on one path told apart by model, and a third model: the 404 is nobody's (it
    was counted on the first route and its backend)."""
    import aiohttp

    from tests.conftest import base_config

    cfg = base_config(upstream.url)
    chat = next(r for r in cfg["routes"] if r["name"] == "chat")
    a = {**chat, "name": "chat-a", "match": {**chat["match"], "model": "model-a"}}
    b = {**chat, "name": "chat-b", "match": {**chat["match"], "model": "model-b"}}
    cfg["routes"] = [a, b]
    gw = start_gateway(cfg)
    body = {"model": "model-zzz", "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as s:
        async with s.post(gw.url + "/v1/chat/completions", json=body) as r:
            assert r.status == 404
        async with s.get(gw.url + "/metrics") as r:
            text = await r.text()
    lines = [
        ln
        for ln in text.splitlines()
        if ln.startswith("latentgate_requests_total{") and 'status="404"' in ln
    ]
    assert len(lines) == 1 and 'route="-"' in lines[0] and 'backend="-"' in lines[0], lines
