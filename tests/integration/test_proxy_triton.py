"""The real tritonclient.http through the gateway answers exactly as against the upstream."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.support.servers import ServerThread


def _client(url: str) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(url=url.removeprefix("http://"), network_timeout=10)


def _infer(url: str, binary: bool) -> dict[str, Any]:
    client = _client(url)
    try:
        fp = httpclient.InferInput("INPUT0", [2, 3], "FP32")
        fp.set_data_from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3) / 4, binary_data=binary)
        text = httpclient.InferInput("INPUT1", [2], "BYTES")
        text.set_data_from_numpy(
            np.array([b"hello", b"gateway"], dtype=np.object_), binary_data=binary
        )
        outputs = [
            httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")
        ]
        result = client.infer("m", [fp, text], outputs=outputs, request_id="req-7")
        return {
            "response": result.get_response(),
            "OUTPUT0": result.as_numpy("OUTPUT0"),
            "OUTPUT1": result.as_numpy("OUTPUT1"),
        }
    finally:
        client.close()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_infer_same_as_direct(upstream: ServerThread, gateway: ServerThread, binary: bool) -> None:
    direct, via = _infer(upstream.url, binary), _infer(gateway.url, binary)
    assert via["response"] == direct["response"]
    assert via["response"]["id"] == "req-7"
    np.testing.assert_array_equal(via["OUTPUT0"], direct["OUTPUT0"])
    np.testing.assert_array_equal(
        via["OUTPUT0"], (np.arange(6, dtype=np.float32).reshape(2, 3) / 4 * 2)
    )
    assert via["OUTPUT0"].dtype == np.float32
    assert [bytes(x) if not isinstance(x, str) else x.encode() for x in via["OUTPUT1"]] == [
        b"HELLO",
        b"GATEWAY",
    ]
    assert list(via["OUTPUT1"]) == list(direct["OUTPUT1"])


def test_metadata_and_readiness_same_as_direct(
    upstream: ServerThread, gateway: ServerThread
) -> None:
    direct, via = _client(upstream.url), _client(gateway.url)
    try:
        assert via.is_server_live() and via.is_server_ready()
        assert via.is_model_ready("m") == direct.is_model_ready("m") is True
        assert via.get_model_metadata("m") == direct.get_model_metadata("m")
        assert via.get_model_metadata("m")["inputs"][0]["name"] == "INPUT0"
        # Server metadata is the gateway's own (it answers /v2 itself).
        assert via.get_server_metadata()["name"] == "latentgate"
        assert direct.get_server_metadata()["name"] == "test-upstream"
    finally:
        direct.close()
        via.close()
