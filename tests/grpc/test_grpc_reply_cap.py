"""A gRPC replica's reply is held to limits.max_body_bytes, as an HTTP v2 replica's answer on
the gRPC listener is (tests/grpc/test_grpc_endless_answer.py): grpcio refuses a bigger one from
its length prefix, the client gets RESOURCE_EXHAUSTED naming the limit, nothing is stored, and
the call is neither retried nor counted against the replica (it answered; a client asking for
a huge output must not get the replicas ejected). Before, the replica channels took any size:
the whole reply was held, passed on and stored."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.grpc.conftest import client, grpc_config
from tests.support.grpc_upstream import GrpcUpstreamThread
from tests.support.servers import ServerThread

CAP = 1 << 20  # the gateway's limits.max_body_bytes here


@pytest.fixture
def two_replicas() -> Iterator[list[GrpcUpstreamThread]]:
    replicas = [GrpcUpstreamThread("r1").start(), GrpcUpstreamThread("r2").start()]
    yield replicas
    for r in replicas:
        r.stop()


def _input() -> list[grpcclient.InferInput]:
    x = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    x.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
    return [x]


def _calls(replicas: list[GrpcUpstreamThread]) -> int:
    return sum(r.model.calls["ModelInfer"] for r in replicas)


def test_a_reply_over_the_cap_is_refused_not_stored_retried_or_counted(
    two_replicas: list[GrpcUpstreamThread], start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(
        grpc_config(
            [f"grpc://{r.target}" for r in two_replicas],
            # one failure would eject a replica, and failures before an answer are retried
            pool={"outlier": {"consecutive_errors": 1, "max_ejection_percent": 50}},
            limits={"max_body_bytes": CAP},
        )
    )
    c = client(gw)
    for n in (1, 2):
        with pytest.raises(InferenceServerException) as err:
            c.infer("m", _input(), headers={"x-test-pad": str(2 * CAP)})
        assert err.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert f"sent an answer over {CAP} bytes (limits.max_body_bytes)" in str(
            err.value.message()
        )
        assert _calls(two_replicas) == n  # not stored, not retried on the other replica
    with urllib.request.urlopen(f"{gw.url}/metrics", timeout=10) as r:
        metrics = r.read().decode()
    assert "latentgate_upstream_ejections_total{" not in metrics
    assert 'latentgate_upstream_replica_ejected{backend="grpc-up",replica="grpc://' in metrics
    assert all(
        line.endswith(" 0.0")
        for line in metrics.splitlines()
        if line.startswith("latentgate_upstream_replica_ejected{")
    )
    # a reply under the cap goes through as before
    small = c.infer("m", _input(), headers={"x-test-pad": str(CAP // 2)})
    np.testing.assert_array_equal(
        small.as_numpy("OUTPUT0"), np.arange(4, dtype=np.float32).reshape(1, 4) * 2
    )
