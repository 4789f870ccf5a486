"""A real gRPC Open Inference v2 model server for tests and benchmarks (grpc.aio, Triton's stubs).

Model `m` (any version): INPUT0 FP32 [n, k] → OUTPUT0 = 2 x INPUT0; INPUT1 BYTES [n] → OUTPUT1
upper-cased. Deterministic, so the gateway's answer can be compared with a direct one byte for
byte. Every answer carries parameters `replica` (this server's name) and `deadline_ms` (the
deadline the call arrived with, -1 without one), so tests see balancing and deadline propagation.

Behaviour on demand through call metadata:
  x-test-delay: S        sleep S seconds before answering
  x-test-status: NAME    fail with that status code (e.g. UNAVAILABLE, INVALID_ARGUMENT)
  x-test-pushback-ms: V  ... with the trailer grpc-retry-pushback-ms: V (gRFC A6)
  x-test-pad: N          answer with N more bytes (a parameter `pad` of N x "p")
Run standalone: python -m tests.support.grpc_upstream --port 9001 [--name NAME] [--delay S]
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import threading
from collections import Counter
from typing import Any

import grpc
import grpc.aio
import numpy as np
from tritonclient.grpc import service_pb2 as pb2
from tritonclient.grpc import service_pb2_grpc as pb2_grpc

MODEL = "m"


def _bytes_elements(raw: bytes) -> list[bytes]:
    out, i = [], 0
    while i < len(raw):
        (n,) = struct.unpack_from("<I", raw, i)
        out.append(raw[i + 4 : i + 4 + n])
        i += 4 + n
    return out


class Model(pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(self, name: str, delay_s: float = 0.0) -> None:
        self.name = name
        self.delay_s = delay_s
        self.calls: Counter[str] = Counter()

    async def _faults(self, context: Any) -> None:
        md = dict(context.invocation_metadata() or ())
        delay = float(md.get("x-test-delay", self.delay_s))
        if delay:
            await asyncio.sleep(delay)
        status = md.get("x-test-status")
        if status:
            pushback = md.get("x-test-pushback-ms")
            trailers = (("grpc-retry-pushback-ms", pushback),) if pushback is not None else ()
            await context.abort(getattr(grpc.StatusCode, status), f"test status {status}", trailers)

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        self.calls["ServerReady"] += 1
        return pb2.ServerReadyResponse(ready=True)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return pb2.ServerMetadataResponse(name=self.name, version="1", extensions=[])

    async def ModelReady(self, request: Any, context: Any) -> Any:
        return pb2.ModelReadyResponse(ready=request.name == MODEL)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        if request.name != MODEL:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no model {request.name}")
        resp = pb2.ModelMetadataResponse(name=MODEL, versions=["1"], platform="test")
        resp.inputs.add(name="INPUT0", datatype="FP32", shape=[-1, -1])
        resp.inputs.add(name="INPUT1", datatype="BYTES", shape=[-1])
        resp.outputs.add(name="OUTPUT0", datatype="FP32", shape=[-1, -1])
        resp.outputs.add(name="OUTPUT1", datatype="BYTES", shape=[-1])
        return resp

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        self.calls["ModelInfer"] += 1
        await self._faults(context)
        if request.model_name != MODEL:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no model {request.model_name}")
        resp = pb2.ModelInferResponse(model_name=MODEL, model_version="1", id=request.id)
        remaining = context.time_remaining()
        resp.parameters["replica"].string_param = self.name
        resp.parameters["deadline_ms"].int64_param = (
            int(remaining * 1000) if remaining is not None else -1
        )
        pad = dict(context.invocation_metadata() or ()).get("x-test-pad")
        if pad is not None:
            resp.parameters["pad"].string_param = "p" * int(pad)
        for i, inp in enumerate(request.inputs):
            raw = request.raw_input_contents[i] if request.raw_input_contents else None
            if inp.datatype == "FP32":
                data = (
                    np.frombuffer(raw, "<f4")
                    if raw is not None
                    else np.asarray(inp.contents.fp32_contents, "<f4")
                )
                out = (data * 2).astype("<f4").tobytes()
                resp.outputs.add(name="OUTPUT0", datatype="FP32", shape=list(inp.shape))
            elif inp.datatype == "BYTES":
                elems = (
                    _bytes_elements(raw) if raw is not None else list(inp.contents.bytes_contents)
                )
                out = b"".join(struct.pack("<I", len(e)) + e.upper() for e in elems)
                resp.outputs.add(name="OUTPUT1", datatype="BYTES", shape=list(inp.shape))
            else:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad input {inp.name}")
            resp.raw_output_contents.append(out)
        return resp


async def start_server(model: Model, port: int = 0) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    pb2_grpc.add_GRPCInferenceServiceServicer_to_server(model, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, bound


class GrpcUpstreamThread:
    """The model server on its own event loop in a daemon thread."""

    def __init__(self, name: str = "grpc-upstream", delay_s: float = 0.0) -> None:
        self.model = Model(name, delay_s)
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._server: grpc.aio.Server | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> GrpcUpstreamThread:
        self._thread.start()
        self._server, self.port = asyncio.run_coroutine_threadsafe(
            start_server(self.model), self.loop
        ).result(30)
        return self

    def stop(self) -> None:
        if self._server is not None:
            asyncio.run_coroutine_threadsafe(self._server.stop(0), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()  # an unclosed loop is a ResourceWarning (and its selector's fd)


async def _main(args: argparse.Namespace) -> None:
    server, port = await start_server(Model(args.name, args.delay), args.port)
    print(f"grpc upstream {args.name} on 127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", default="grpc-upstream")
    parser.add_argument("--delay", type=float, default=0.0)
    asyncio.run(_main(parser.parse_args()))
