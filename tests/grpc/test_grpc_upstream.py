"""tritonclient.grpc through the gateway's gRPC listener to a gRPC v2 upstream pool."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2_grpc as pb2_grpc
from tritonclient.utils import InferenceServerException

from gateway.grpc.proto import pb2
from tests.grpc.conftest import client, grpc_config, grpc_port
from tests.support.grpc_upstream import GrpcUpstreamThread
from tests.support.servers import ServerThread


def _inputs(scale: float = 1.0) -> list[grpcclient.InferInput]:
    fp = grpcclient.InferInput("INPUT0", [2, 3], "FP32")
    fp.set_data_from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3) * scale)
    text = grpcclient.InferInput("INPUT1", [2], "BYTES")
    text.set_data_from_numpy(np.array([b"hello", b"gateway"], dtype=np.object_))
    return [fp, text]


def _infer(c: grpcclient.InferenceServerClient, **kw: Any) -> Any:
    return c.infer("m", _inputs(kw.pop("scale", 1.0)), request_id=kw.pop("request_id", "r-1"), **kw)


def test_infer_same_as_direct_and_a_hit_on_repeat(
    grpc_upstream: GrpcUpstreamThread, grpc_gateway: ServerThread
) -> None:
    direct = grpcclient.InferenceServerClient(grpc_upstream.target)
    via = client(grpc_gateway)
    want = _infer(direct)
    first = _infer(via)
    assert first.get_response(as_json=True)["parameters"]["replica"] == {"string_param": "u1"}
    np.testing.assert_array_equal(first.as_numpy("OUTPUT0"), want.as_numpy("OUTPUT0"))
    assert list(first.as_numpy("OUTPUT1")) == [b"HELLO", b"GATEWAY"]
    assert first.get_response().id == "r-1"
    calls = grpc_upstream.model.calls["ModelInfer"]
    again = _infer(via, request_id="r-2")
    assert grpc_upstream.model.calls["ModelInfer"] == calls  # served by the cache
    np.testing.assert_array_equal(again.as_numpy("OUTPUT0"), want.as_numpy("OUTPUT0"))
    assert again.get_response().id == "r-2"  # the id is this call's, not the stored one's
    other = _infer(via, scale=3.0)
    assert grpc_upstream.model.calls["ModelInfer"] == calls + 1
    np.testing.assert_array_equal(
        other.as_numpy("OUTPUT0"), np.arange(6, dtype=np.float32).reshape(2, 3) * 6
    )


def test_x_cache_in_initial_metadata_and_metrics(grpc_gateway: ServerThread) -> None:
    req = pb2.ModelInferRequest(model_name="m", id="x")
    inp = req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 2])
    inp.contents.fp32_contents.extend([1.0, 2.0])
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port(grpc_gateway)}") as ch:
        call = ch.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=pb2.ModelInferRequest.SerializeToString,
            response_deserializer=pb2.ModelInferResponse.FromString,
        )
        results = []
        for _ in range(2):
            resp, rpc = call.with_call(req, timeout=10)
            results.append(dict(rpc.initial_metadata())["x-cache"])
    assert results == ["miss", "hit"]
    assert list(resp.raw_output_contents) == [np.asarray([2.0, 4.0], "<f4").tobytes()]
    with urllib.request.urlopen(f"{grpc_gateway.url}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert 'latentgate_cache_lookups_total{result="hit",route="grpc-v2",tier="memory"} 1.0' in text
    assert (
        'latentgate_grpc_requests_total{cache="hit",code="OK",method="ModelInfer",'
        'route="grpc-v2"} 1.0' in text
    )


def test_health_and_metadata_through_the_gateway(grpc_gateway: ServerThread) -> None:
    c = client(grpc_gateway)
    assert c.is_server_live() and c.is_server_ready()
    assert c.is_model_ready("m")
    meta = c.get_model_metadata("m", as_json=True)
    assert [i["name"] for i in meta["inputs"]] == ["INPUT0", "INPUT1"]
    assert c.get_server_metadata().name == "latentgate"


def test_errors_map_to_status_codes(grpc_gateway: ServerThread) -> None:
    c = client(grpc_gateway)
    bad = grpcclient.InferInput("INPUT0", [2, 3], "FP32")
    bad.set_data_from_numpy(np.zeros((2, 3), np.float32))
    bad._raw_content = b"\x00" * 5  # fewer bytes than 2 x 3 FP32
    with pytest.raises(InferenceServerException) as err:
        c.infer("m", [bad])
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "5 bytes do not fit FP32 [2, 3]" in err.value.message()
    twice = _inputs()[:1] * 2  # two inputs of one name: named tensors, not a request
    with pytest.raises(InferenceServerException) as err:
        c.infer("m", twice)
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "'INPUT0' appears more than once" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        c.get_model_metadata("nope")
    assert err.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as err:
        _infer(c, headers={"x-test-status": "RESOURCE_EXHAUSTED"})
    assert err.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "test status" in err.value.message()


def test_another_tenant_is_not_served_the_cached_answer(
    grpc_upstream: GrpcUpstreamThread, grpc_gateway: ServerThread
) -> None:
    c = client(grpc_gateway)
    _infer(c, headers={"authorization": "Bearer tenant-a"})
    calls = grpc_upstream.model.calls["ModelInfer"]
    _infer(c, headers={"authorization": "Bearer tenant-a"})
    assert grpc_upstream.model.calls["ModelInfer"] == calls  # same tenant: a hit
    _infer(c, headers={"authorization": "Bearer tenant-b"})
    assert grpc_upstream.model.calls["ModelInfer"] == calls + 1  # another tenant: a miss
    _infer(c, headers={"authorization": "Bearer tenant-b", "cache-control": "no-cache"})
    assert grpc_upstream.model.calls["ModelInfer"] == calls + 2  # no-cache skips the lookup


def test_breaker_overload_is_resource_exhausted(
    grpc_upstream: GrpcUpstreamThread, start_gateway: Any
) -> None:
    pool = {"breaker": {"max_in_flight": 1, "max_pending": 0}}
    gw = start_gateway(grpc_config([f"grpc://{grpc_upstream.target}"], pool=pool))
    slow = threading.Thread(target=lambda: _infer(client(gw), headers={"x-test-delay": "1"}))
    slow.start()
    try:
        while grpc_upstream.model.calls["ModelInfer"] == 0:
            time.sleep(0.01)
        with pytest.raises(InferenceServerException) as err:
            _infer(client(gw), scale=2.0)
        assert err.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    finally:
        slow.join(10)


def test_http_request_on_a_grpc_route_is_a_404(grpc_gateway: ServerThread) -> None:
    req = urllib.request.Request(
        f"{grpc_gateway.url}/inference.GRPCInferenceService/ModelInfer", data=b"{}"
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 404
    assert b"gRPC route" in err.value.read()
    err.value.close()  # an HTTPError holds the socket; the traceback keeps it past this test


def test_grpc_call_to_an_http_v2_pool_is_translated(
    upstream: ServerThread, start_gateway: Any
) -> None:
    cfg = grpc_config([upstream.url])  # an HTTP v2 replica behind a gRPC route
    gw = start_gateway(cfg)
    result = _infer(client(gw), request_id="t-1")
    np.testing.assert_array_equal(
        result.as_numpy("OUTPUT0"), np.arange(6, dtype=np.float32).reshape(2, 3) * 2
    )
    assert list(result.as_numpy("OUTPUT1")) == [b"HELLO", b"GATEWAY"]
    assert result.get_response().id == "t-1"


def test_hits_from_redis_keep_the_reply_bytes(
    grpc_upstream: GrpcUpstreamThread, redis_server: Any, start_gateway: Any
) -> None:
    cfg = grpc_config(
        [f"grpc://{grpc_upstream.target}"],
        route={"cache": {"exact": {"enabled": True, "tiers": ["redis"]}}},
        cache={"redis": {"url": redis_server.url, "key_prefix": "lg-grpc-test:"}},
    )
    c = client(start_gateway(cfg))
    first = _infer(c, scale=7.0)
    calls = grpc_upstream.model.calls["ModelInfer"]
    again = _infer(c, scale=7.0, request_id="r-9")
    assert grpc_upstream.model.calls["ModelInfer"] == calls
    np.testing.assert_array_equal(again.as_numpy("OUTPUT0"), first.as_numpy("OUTPUT0"))
    assert again.get_response().id == "r-9"


def test_a_message_over_the_body_limit_is_resource_exhausted(
    grpc_upstream: GrpcUpstreamThread, start_gateway: Any
) -> None:
    cfg = grpc_config([f"grpc://{grpc_upstream.target}"], limits={"max_body_bytes": 4096})
    c = client(start_gateway(cfg))
    big = grpcclient.InferInput("INPUT0", [1, 2048], "FP32")
    big.set_data_from_numpy(np.zeros((1, 2048), np.float32))
    with pytest.raises(InferenceServerException) as err:
        c.infer("m", [big])
    assert err.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "4096" in err.value.message()
    calls = grpc_upstream.model.calls["ModelInfer"]
    assert calls == 0  # refused at the gateway


def test_a_sequence_model_is_never_answered_from_the_cache_over_grpc(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """gRPC calls to an HTTP v2 replica: a stateful model's steps each reach it, none replayed."""
    gw = start_gateway(grpc_config([upstream.url]))
    c = client(gw)
    got = []
    try:
        for _ in range(2):
            for step in range(4):
                inp = grpcclient.InferInput("INPUT0", [1], "FP32")
                inp.set_data_from_numpy(np.ones(1, np.float32))
                res = c.infer(
                    "accumulate",
                    [inp],
                    sequence_id=7,
                    sequence_start=step == 0,
                    sequence_end=step == 3,
                )
                got.append(float(res.as_numpy("OUTPUT0")[0]))
    finally:
        c.close()
    assert got == [1, 2, 3, 4, 1, 2, 3, 4]


def test_only_if_cached_metadata_is_a_hit_or_unavailable_without_going_upstream(
    grpc_upstream: GrpcUpstreamThread, grpc_gateway: ServerThread
) -> None:
    via = client(grpc_gateway)
    only = {"cache-control": "only-if-cached"}
    with pytest.raises(InferenceServerException) as err:
        _infer(via, headers=only)
    assert "UNAVAILABLE" in str(err.value.status()) and "only-if-cached" in str(err.value)
    assert grpc_upstream.model.calls["ModelInfer"] == 0
    stored = _infer(via)
    again = _infer(via, headers=only)
    np.testing.assert_array_equal(again.as_numpy("OUTPUT0"), stored.as_numpy("OUTPUT0"))
    assert grpc_upstream.model.calls["ModelInfer"] == 1


def test_a_replicas_retry_pushback_is_honoured(
    grpc_upstream: GrpcUpstreamThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """gRFC A6: an UNAVAILABLE with grpc-retry-pushback-ms -1 is not retried; one asking a
    wait past the route's deadline goes back to the client at once, not after the wait."""
    route = {"upstream": {"retries": {"max": 2}, "timeouts": {"total": 2}}}
    gw = start_gateway(grpc_config([f"grpc://{grpc_upstream.target}"], route=route))
    c = client(gw)
    for pushback, tries in (("-1", 1), ("60000", 1), (None, 3)):
        headers = {"x-test-status": "UNAVAILABLE"}
        if pushback is not None:
            headers["x-test-pushback-ms"] = pushback
        calls = grpc_upstream.model.calls["ModelInfer"]
        with pytest.raises(InferenceServerException) as err:
            _infer(c, headers=headers, scale=float(tries))
        assert err.value.status() == "StatusCode.UNAVAILABLE"
        assert grpc_upstream.model.calls["ModelInfer"] - calls == tries, pushback


def test_raw_and_typed_contents_together_are_invalid_argument(
    grpc_gateway: ServerThread, grpc_upstream: GrpcUpstreamThread
) -> None:
    """The key reads the raw bytes; a model server that read the typed contents would answer
    for another tensor, and that answer was stored under the raw tensor's key (before: OK,
    cached). tritonclient never sends both: a raw call through its stubs."""
    req = pb2.ModelInferRequest(model_name="m")
    inp = req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 2])
    inp.contents.fp32_contents.extend([5.0, 6.0])
    req.raw_input_contents.append(np.asarray([1.0, 2.0], "<f4").tobytes())
    calls = grpc_upstream.model.calls["ModelInfer"]
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port(grpc_gateway)}") as channel:
        stub = pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(req, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "typed contents and raw_input_contents both given" in str(err.value.details())
        del req.inputs[0].contents.fp32_contents[:]  # contents still set, if empty
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(req, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        req.inputs[0].ClearField("contents")  # raw alone is fine
        reply = stub.ModelInfer(req, timeout=10)
    assert np.frombuffer(reply.raw_output_contents[0], "<f4").tolist() == [2.0, 4.0]
    assert grpc_upstream.model.calls["ModelInfer"] == calls + 1
