"""gRPC pools under faults: a replica killed mid-load, deadlines, hedging, a draining gateway."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.grpc.conftest import client, grpc_config
from tests.support.grpc_upstream import GrpcUpstreamThread
from tests.support.servers import ROOT, GatewayProcess, ServerThread, free_port, wait_port


def _input(value: float) -> list[grpcclient.InferInput]:
    inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.full((1, 4), value, np.float32))
    return [inp]


def _replica(extra: dict[str, str], result: grpcclient.InferResult) -> str:
    params = result.get_response(as_json=True)["parameters"]
    return str(params["replica"]["string_param"])


class UpstreamProcess:
    def __init__(self, name: str, delay_s: float = 0.0) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.grpc_upstream", "--port", str(self.port),
             "--name", name, "--delay", str(delay_s)],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_port("127.0.0.1", self.port)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def two_replicas() -> Iterator[list[UpstreamProcess]]:
    procs = [UpstreamProcess("r1"), UpstreamProcess("r2")]
    yield procs
    for p in procs:
        p.kill()


@pytest.mark.slow
def test_replica_killed_mid_load_fails_no_call(
    two_replicas: list[UpstreamProcess], start_gateway: Callable[..., ServerThread]
) -> None:
    replicas = [f"grpc://127.0.0.1:{p.port}" for p in two_replicas]
    # No cache: every call must reach a replica.
    gw = start_gateway(grpc_config(replicas, route={"cache": {}}))
    total, kill_at = 400, 120
    done = threading.Semaphore(0)
    served: list[str] = []

    def one(i: int) -> str:
        c = clients.setdefault(threading.get_ident(), client(gw))
        result = c.infer("m", _input(float(i)), client_timeout=10)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 4), 2.0 * i))
        done.release()
        return _replica({}, result)

    clients: dict[int, grpcclient.InferenceServerClient] = {}
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(one, i) for i in range(total)]
        for _ in range(kill_at):
            done.acquire()
        two_replicas[0].kill()  # SIGKILL with calls in flight
        served = [f.result() for f in futures]  # any failed call raises here
    after = served[kill_at + 16 :]  # a little after the kill: r1 is gone
    assert len(served) == total
    assert set(served[:kill_at]) == {"r1", "r2"}
    assert after and set(after) == {"r2"}


def test_deadline_propagated_and_client_timeout(
    grpc_upstream: GrpcUpstreamThread, grpc_gateway: ServerThread
) -> None:
    c = client(grpc_gateway)
    result = c.infer("m", _input(1.0), client_timeout=8.0)
    deadline_ms = result.get_response(as_json=True)["parameters"]["deadline_ms"]["int64_param"]
    # the client's deadline, less the time spent on the way; each hop's grpc-timeout header is
    # rounded up to its unit (8009 ms was seen once), never by more than a few tens of ms
    assert 0 < int(deadline_ms) <= 8100
    no_deadline = c.infer("m", _input(2.0))
    # Without a client deadline the route's total timeout (10 s here) goes upstream.
    got = int(no_deadline.get_response(as_json=True)["parameters"]["deadline_ms"]["int64_param"])
    assert 8000 < got < 11000  # (less the time on the way; grpc-timeout is rounded up)
    with pytest.raises(InferenceServerException) as err:
        c.infer("m", _input(3.0), client_timeout=0.3, headers={"x-test-delay": "2"})
    assert err.value.status() == "StatusCode.DEADLINE_EXCEEDED"


def test_route_timeout_is_deadline_exceeded_with_a_message(
    grpc_upstream: GrpcUpstreamThread, start_gateway: Callable[..., ServerThread]
) -> None:
    route = {"upstream": {"timeouts": {"total": 0.3}}}
    gw = start_gateway(grpc_config([f"grpc://{grpc_upstream.target}"], route=route))
    with pytest.raises(InferenceServerException) as err:
        client(gw).infer("m", _input(1.0), headers={"x-test-delay": "1"})
    assert err.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert "grpc-up timed out" in err.value.message()


def test_hedge_answers_from_the_fast_replica(start_gateway: Callable[..., ServerThread]) -> None:
    slow, fast = GrpcUpstreamThread("slow", delay_s=1.0).start(), GrpcUpstreamThread("fast").start()
    try:
        cfg = grpc_config(
            [f"grpc://{slow.target}", f"grpc://{fast.target}"],
            route={"cache": {}, "upstream": {"hedge": {"after_ms": 50}}},
            pool={"balancer": {"policy": "round_robin"}},
        )
        c = client(start_gateway(cfg))
        replicas = [_replica({}, c.infer("m", _input(float(i)))) for i in range(4)]
        assert replicas == ["fast"] * 4  # no answer came from the slow replica
        assert slow.model.calls["ModelInfer"] >= 1  # it was tried, and beaten
    finally:
        slow.stop()
        fast.stop()


@pytest.mark.slow
def test_sigterm_drains_in_flight_grpc_calls(grpc_upstream: GrpcUpstreamThread) -> None:
    port = free_port()
    cfg = grpc_config([f"grpc://{grpc_upstream.target}"], route={"cache": {}})
    cfg["listeners"] = [{"name": "grpc", "protocol": "grpc", "host": "127.0.0.1", "port": port}]
    gw = GatewayProcess(cfg).start()
    wait_port("127.0.0.1", port)
    try:
        c = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        assert c.is_server_ready()
        results: list[object] = []

        def slow_call() -> None:
            try:
                results.append(c.infer("m", _input(5.0), headers={"x-test-delay": "1"}))
            except InferenceServerException as exc:
                results.append(exc)

        t = threading.Thread(target=slow_call)
        t.start()
        time.sleep(0.3)  # the call is in flight upstream
        assert gw.proc is not None
        gw.proc.send_signal(signal.SIGTERM)
        t.join(10)
        assert gw.proc.wait(30) == 0
        assert len(results) == 1 and isinstance(results[0], grpcclient.InferResult), results
        np.testing.assert_array_equal(results[0].as_numpy("OUTPUT0"), np.full((1, 4), 10.0))
    finally:
        gw.stop()
