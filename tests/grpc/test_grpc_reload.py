"""A config reload covers the gRPC listener: the next call uses the new backends and routes."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml

from gateway.app import build_app
from gateway.config import load_settings
from tests.grpc.conftest import client, grpc_config
from tests.support.grpc_upstream import GrpcUpstreamThread
from tests.support.servers import ServerThread


@pytest.fixture
def upstreams() -> Iterator[tuple[GrpcUpstreamThread, GrpcUpstreamThread]]:
    a, b = GrpcUpstreamThread("a").start(), GrpcUpstreamThread("b").start()
    yield a, b
    a.stop()
    b.stop()


def _replica(c: grpcclient.InferenceServerClient, value: float) -> str:
    inp = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
    inp.set_data_from_numpy(np.full((1, 2), value, np.float32))
    params = c.infer("m", [inp]).get_response(as_json=True)["parameters"]
    return str(params["replica"]["string_param"])


def test_reload_swaps_the_grpc_backend(
    upstreams: tuple[GrpcUpstreamThread, GrpcUpstreamThread], tmp_path: Path
) -> None:
    a, b = upstreams
    path = tmp_path / "lg.yaml"
    path.write_text(yaml.safe_dump(grpc_config([f"grpc://{a.target}"], admin={"token": "tok"})))
    gw = ServerThread(lambda: build_app(load_settings(path), str(path))).start()
    try:
        c = client(gw)
        assert _replica(c, 1.0) == "a"
        path.write_text(yaml.safe_dump(grpc_config([f"grpc://{b.target}"], admin={"token": "tok"})))
        req = urllib.request.Request(f"{gw.url}/admin/reload", data=b"", method="POST",
                                     headers={"Authorization": "Bearer tok"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert json.loads(resp.read())["backends_replaced"] == ["grpc-up"]
        assert _replica(c, 2.0) == "b"
        assert _replica(c, 1.0) == "a"  # cached before the reload: the policy did not change
    finally:
        gw.stop()
