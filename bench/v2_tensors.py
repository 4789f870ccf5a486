"""Large v2 tensors: the conversions' CPU time, old against new, and /healthz during requests.

One command: .venv/bin/python bench/v2_tensors.py [--runs 5] [--e2e]
Codec part: medians of --runs runs, in one process, of the conversions a large v2 request
makes, as they were (inline copies of the old code) and as they are: writing 4M FP32 as JSON
data, reading 4M typed gRPC contents (FP32, INT32), and a local engine's decode of a 16 MB
JSON body (800,000 FP32 numbers). --e2e: a gateway (in-process, local ONNX models as in
tests/local/test_large_tensors.py) answering /healthz in a loop while it serves one JSON answer
of 4M floats over HTTP and one call of 8M INT32 typed contents over gRPC; it prints each
request's time, the /healthz answers meanwhile and the longest wait for one. Run it from
another checkout (PYTHONPATH) for the old code's figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backends.local.v2codec import InferRequest, decode_infer, encode_infer  # noqa: E402
from backends.v2tensors import V2_NUMERIC  # noqa: E402
from gateway.grpc.proto import pb2  # noqa: E402

N = 4_000_000


def median_s(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def old_flatten(data: Any) -> list[Any]:
    if isinstance(data, list):
        out: list[Any] = []
        for item in data:
            out.extend(old_flatten(item))
        return out
    return [data]


def old_decode(body: bytes) -> np.ndarray:
    """What the local engine did with a JSON body's tensor: json.loads, flatten, np.asarray."""
    inp = json.loads(body.decode("utf-8"))["inputs"][0]
    return np.asarray(old_flatten(inp["data"]), V2_NUMERIC[inp["datatype"]])


def codec(runs: int) -> None:
    from gateway.grpc.contents import contents_bytes

    rng = np.random.default_rng(0)
    floats = rng.standard_normal((1, N)).astype(np.float32)
    req = InferRequest(None, {}, set(), None, False)
    rows: list[tuple[str, Callable[[], object], Callable[[], object]]] = [
        ("JSON data of 4M FP32 (encode_infer)",
         lambda: json.dumps(floats.reshape(-1).tolist()),
         lambda: encode_infer("m", req, {"y": ("FP32", floats)})),
    ]  # fmt: skip
    for datatype, field, values in (
        ("FP32", "fp32_contents", floats.reshape(-1)),
        ("INT32", "int_contents", rng.integers(-(2**31), 2**31 - 1, N, dtype=np.int32)),
    ):
        msg = pb2.InferTensorContents()
        getattr(msg, field).extend(values.tolist())
        contents = pb2.InferTensorContents.FromString(msg.SerializeToString())
        dt = V2_NUMERIC[datatype]
        rows.append((
            f"gRPC {field}, 4M {datatype}",
            lambda c=contents, f=field, d=dt: np.asarray(list(getattr(c, f)), d).tobytes(),
            lambda c=contents, f=field, d=dt: contents_bytes(c, f, d),
        ))  # fmt: skip
    n = 800_000
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, n],
                       "data": floats.reshape(-1)[:n].tolist()}]}  # fmt: skip
    body = json.dumps(doc).encode()
    rows.append((
        f"local decode of a {len(body) / 1e6:.1f} MB JSON body",
        lambda: old_decode(body),
        lambda: decode_infer(body, None, "application/json"),
    ))  # fmt: skip
    print(f"{'conversion':<44} {'old s':>8} {'new s':>8} {'x':>6}")
    for name, old, new in rows:
        a, b = median_s(old, runs), median_s(new, runs)
        print(f"{name:<44} {a:8.3f} {b:8.3f} {a / b:6.1f}")


def e2e() -> None:
    import grpc
    from tritonclient.grpc import service_pb2_grpc as pb2_grpc

    from tests.grpc.conftest import grpc_port
    from tests.local import test_large_tensors as models
    from tests.local.conftest import http

    class Tmp:
        def mktemp(self, name: str) -> Path:
            return Path(tempfile.mkdtemp(prefix=name))

    fixture: Any = models.gw  # (the tests' gateway, out of its pytest fixture)
    gen = fixture.__wrapped__(Tmp())
    gw = next(gen)
    x = np.random.default_rng(7).standard_normal((1, 1000)).astype(np.float32)
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1000],
                                   "data": x.reshape(-1).tolist()}]}).encode()  # fmt: skip

    def json_answer() -> None:
        import urllib.request

        request = urllib.request.Request(f"{gw.url}/v2/models/tiles/infer", data=body,
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=300) as resp:
            resp.read()

    ints = np.random.default_rng(8).integers(0, 128, 2 * N, dtype=np.int32)
    msg = pb2.ModelInferRequest(model_name="sums")
    msg.inputs.add(name="x", datatype="INT32", shape=[1, 2 * N]).contents.int_contents.extend(
        ints.tolist()
    )

    def typed_call() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port(gw)}") as channel:
            pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(msg, timeout=300)

    for name, work in (("HTTP: 4M floats answered as JSON", json_answer),
                       ("gRPC: 8M INT32 in int_contents", typed_call)):  # fmt: skip
        worker = threading.Thread(target=work)
        start = time.perf_counter()
        worker.start()
        stamps = [start]
        while worker.is_alive():
            http("GET", f"{gw.url}/healthz")
            stamps.append(time.perf_counter())
        took = time.perf_counter() - start
        gap = max(np.diff(stamps)) if len(stamps) > 1 else took
        print(f"{name:<36} {took:6.2f} s, /healthz answered {len(stamps) - 1:5d} times, "
              f"longest wait {gap * 1000:7.0f} ms")  # fmt: skip
    next(gen, None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--e2e", action="store_true")
    args = parser.parse_args()
    if args.e2e:
        e2e()
    else:
        codec(args.runs)


if __name__ == "__main__":
    main()
