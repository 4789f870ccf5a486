"""gRPC ModelInfer (and the metadata RPCs) to an HTTP v2 replica that answers with an endless
body: the gateway needs the answer whole to make one gRPC reply of it, so it reads at most
limits.max_body_bytes, then closes the connection and answers RESOURCE_EXHAUSTED naming the
limit. Before, it buffered the whole body (all 256 MiB the replica offers here, an endless one
until the route's total timeout) and the client got UNKNOWN."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.grpc.conftest import client, grpc_config
from tests.support.endless_replica import IN_FLIGHT, EndlessReplica
from tests.support.servers import ServerThread

CAP = 1 << 20  # the gateway's limits.max_body_bytes here
_NO_CACHE = {"cache": {"exact": {"enabled": False}}}


def _config(url: str, route: dict[str, Any]) -> dict[str, Any]:
    # a total far beyond what reading the cap takes: the cap, not the clock, ends the read
    return grpc_config(
        [url],
        pool={"timeouts": {"connect": 5, "read": 60, "total": 60}},
        route=route,
        limits={"max_body_bytes": CAP},
    )


@pytest.mark.parametrize("route", [{}, _NO_CACHE], ids=["cached", "uncached"])
async def test_an_endless_infer_answer_is_resource_exhausted_after_the_cap(
    start_gateway: Callable[..., ServerThread], route: dict[str, Any]
) -> None:
    replica = EndlessReplica(200, b"application/json")
    url = await replica.raw.start()
    try:
        gw = start_gateway(_config(url, route))
        x = grpcclient.InferInput("x", [2], "FP32")
        x.set_data_from_numpy(np.array([1.5, 4.0], dtype=np.float32))
        with pytest.raises(InferenceServerException) as err:
            await asyncio.to_thread(client(gw).infer, "echo", [x])
        assert err.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert f"over {CAP} bytes" in str(err.value.message())
        await asyncio.wait_for(replica.closed.wait(), 60)
        assert CAP < replica.sent < CAP + IN_FLIGHT
    finally:
        await replica.raw.stop()


async def test_an_endless_metadata_answer_is_resource_exhausted_after_the_cap(
    start_gateway: Callable[..., ServerThread],
) -> None:
    replica = EndlessReplica(200, b"application/json")
    url = await replica.raw.start()
    try:
        gw = start_gateway(_config(url, {}))
        with pytest.raises(InferenceServerException) as err:
            await asyncio.to_thread(client(gw).get_model_metadata, "echo")
        assert err.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        await asyncio.wait_for(replica.closed.wait(), 60)
        assert CAP < replica.sent < CAP + IN_FLIGHT
    finally:
        await replica.raw.stop()
