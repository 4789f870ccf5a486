"""gRPC calls translated to an HTTP v2 replica: the model name and version are one path segment
each, whatever they hold.

A gRPC model name is any string. Put in the HTTP path as it was, `double/versions/3` asked the
replica for model double's version 3, and `double/infer?x=` for model double, each answer
cached under the key of a model that is neither (the key reads the name from the message), and
a ModelMetadata call for `double/versions/3` read double's. Through the real tritonclient.grpc
against the aiohttp test replica, which answers any model under the name it reads.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.grpc.conftest import GRPC_PREFIX, client
from tests.support.servers import ServerThread


def _gateway(upstream: ServerThread, start_gateway: Callable[..., ServerThread]) -> ServerThread:
    return start_gateway(
        {
            "listeners": [
                {"name": "main", "host": "127.0.0.1", "port": 0},
                {"name": "grpc", "protocol": "grpc", "host": "127.0.0.1", "port": 0},
            ],
            "backends": {"http-v2": {"kind": "remote", "replicas": [upstream.url]}},
            "routes": [
                {
                    "name": "grpc-to-http",
                    "match": {"prefix": GRPC_PREFIX},
                    "protocol": "grpc",
                    "backend": "http-v2",
                    "cache": {"exact": {"enabled": True, "tiers": ["memory"]}},
                }
            ],
        }
    )


def _infer(triton: grpcclient.InferenceServerClient, model: str, version: str = "") -> str:
    x = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
    x.set_data_from_numpy(np.array([[1.5, 4.0]], dtype=np.float32))
    got = triton.infer(model, [x], model_version=version)
    np.testing.assert_array_equal(got.as_numpy("OUTPUT0"), [[3.0, 8.0]])
    return str(got.get_response().model_name)


@pytest.mark.parametrize(
    ("model", "version"),
    [("double/versions/3", ""), ("double/infer?x=", "")],
    ids=["slash", "query"],
)
def test_a_model_name_with_path_characters_is_that_model_cold_and_warm(
    upstream: ServerThread,
    start_gateway: Callable[..., ServerThread],
    model: str,
    version: str,
) -> None:
    triton = client(_gateway(upstream, start_gateway))
    try:
        for _ in range(2):  # a miss, then a hit of the same entry
            assert _infer(triton, model, version) == model
        # model double's own entries are apart from it: its name, cold and warm
        for _ in range(2):
            assert _infer(triton, "double", "3") == "double"
    finally:
        triton.close()


def test_model_metadata_of_a_name_with_a_slash_is_that_models(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    triton = client(_gateway(upstream, start_gateway))
    try:
        assert triton.get_model_metadata("double/versions/3").name == "double/versions/3"
        assert triton.get_model_metadata("double").name == "double"
    finally:
        triton.close()
