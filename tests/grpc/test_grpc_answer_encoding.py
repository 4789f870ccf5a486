"""gRPC ModelInfer to an HTTP v2 replica: the gateway parses the replica's answer as it arrives
(the transport does not decode bodies), so it asks for identity whatever the call's metadata
says. A client's `accept-encoding: gzip` metadata went upstream as a header, the replica (as
Triton does) gzipped its answer, and the client got INTERNAL ("an unreadable v2 answer")."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from aiohttp import web

from tests.grpc.conftest import client, grpc_config
from tests.support.servers import ServerThread, one_route, running


async def _gzipping_infer(request: web.Request) -> web.Response:
    """A v2 replica's infer: one FP32 output, the input doubled; gzipped when the request
    accepts gzip."""
    body = await request.read()
    length = request.headers.get("Inference-Header-Content-Length")
    doc = json.loads(body[: int(length)] if length else body)
    (x,) = doc["inputs"]
    data = x.get("data") or list(np.frombuffer(body[int(length or 0) :], np.float32))
    answer = json.dumps(
        {
            "model_name": "echo",
            "outputs": [
                {
                    "name": "out",
                    "datatype": "FP32",
                    "shape": x["shape"],
                    "data": [2 * float(v) for v in data],
                }
            ],
        }
    ).encode()
    if "gzip" in request.headers.get("Accept-Encoding", ""):
        return web.Response(
            body=gzip.compress(answer),
            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        )
    return web.Response(body=answer, content_type="application/json")


@pytest.fixture
def replica() -> Iterator[ServerThread]:
    with running(one_route("/v2/models/echo/infer", _gzipping_infer)) as server:
        yield server


@pytest.mark.parametrize("accept", ["gzip", "gzip, deflate", "br;q=1, gzip;q=0.5"])
def test_accept_encoding_metadata_does_not_reach_the_replica(
    replica: ServerThread, start_gateway: Callable[..., ServerThread], accept: str
) -> None:
    gw = start_gateway(grpc_config([replica.url]))
    x = grpcclient.InferInput("x", [2], "FP32")
    x.set_data_from_numpy(np.array([1.5, 4.0], dtype=np.float32))
    got = client(gw).infer("echo", [x], headers={"accept-encoding": accept})
    assert got.as_numpy("out").tolist() == [3.0, 8.0]
