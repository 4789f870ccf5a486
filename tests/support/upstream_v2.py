"""The test upstream's Open Inference v2 handlers: server and model metadata, and infer
(numeric tensors doubled, BOOL echoed, BYTES upper-cased; JSON or the binary extension)."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
from aiohttp import web

from tests.support.upstream_base import common, extra_headers, stats

_DT = {
    "BOOL": "?", "INT8": "i1", "INT16": "<i2", "INT32": "<i4", "INT64": "<i8",
    "UINT8": "<u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8",
    "FP16": "<f2", "FP32": "<f4", "FP64": "<f8",
}  # fmt: skip


async def v2_server(request: web.Request) -> web.Response:
    return web.json_response(
        {"name": "test-upstream", "version": "1", "extensions": ["binary_tensor_data"]}
    )


async def v2_model(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    return web.json_response(
        {
            "name": name,
            "versions": ["1"],
            "platform": "test",
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, -1]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, -1]}],
        }
    )


async def v2_infer(request: web.Request) -> web.StreamResponse:
    """OUTPUT<i> = INPUT<i> * 2 for numeric tensors; BOOL tensors are echoed; BYTES tensors are
    echoed upper-cased. A request it cannot read gets Triton's 400 {"error": ...}, not a 500."""
    try:
        if (early := await common(request)) is not None:
            return early
        try:
            return await _v2_answer(request)
        except (KeyError, ValueError, TypeError, IndexError, struct.error) as exc:
            return web.json_response({"error": f"bad infer request: {exc!r}"}, status=400)
    finally:
        stats(request.app)["in_flight"] -= 1


SEQUENCES = web.AppKey("v2_sequences", dict)


def _accumulate(request: web.Request, doc: dict[str, Any], binary: bytes) -> web.Response:
    """A stateful (sequence) model, as Triton's sequence batcher runs them: OUTPUT0 is the
    running sum of INPUT0 over the requests of one sequence_id since its sequence_start."""
    params = doc.get("parameters") or {}
    sums = request.app[SEQUENCES]
    sid = params.get("sequence_id", 0)
    if params.get("sequence_start"):
        sums[sid] = 0.0
    inp = doc["inputs"][0]
    size = (inp.get("parameters") or {}).get("binary_data_size")
    values = np.frombuffer(binary[:size], np.float32) if size is not None else inp["data"]
    sums[sid] = sums.get(sid, 0.0) + float(np.sum(values))
    body: dict[str, Any] = {
        "model_name": "accumulate",
        "model_version": "1",
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1], "data": [sums[sid]]}],
    }
    if "id" in doc:
        body["id"] = doc["id"]
    if params.get("sequence_end"):
        sums.pop(sid, None)
    return web.json_response(body, headers=extra_headers(request))


async def _v2_answer(request: web.Request) -> web.Response:
    raw = await request.read()
    hlen = request.headers.get("Inference-Header-Content-Length")
    header, binary = (raw[: int(hlen)], raw[int(hlen) :]) if hlen else (raw, b"")
    doc = json.loads(header)
    if "id" in doc and not isinstance(doc["id"], str):  # as Triton: "Unable to parse 'id'"
        return web.json_response({"error": "Unable to parse 'id'"}, status=400)
    if request.match_info["name"] == "accumulate":
        return _accumulate(request, doc, binary)
    arrays: list[tuple[dict[str, Any], Any]] = []
    off = 0
    for inp in doc["inputs"]:
        size = (inp.get("parameters") or {}).get("binary_data_size")
        if inp["datatype"] == "BYTES":
            if size is not None:
                chunk, off = binary[off : off + size], off + size
                vals, i = [], 0
                while i < len(chunk):
                    (n,) = struct.unpack_from("<I", chunk, i)
                    vals.append(chunk[i + 4 : i + 4 + n].decode())
                    i += 4 + n
            else:
                vals = list(np.array(inp["data"]).reshape(-1))
            arrays.append((inp, [str(v).upper() for v in vals]))
            continue
        if inp["datatype"] not in _DT:
            raise ValueError(f"unsupported datatype {inp['datatype']}")
        dt = np.dtype(_DT[inp["datatype"]])
        if size is None and inp["datatype"] == "FP16":  # as Triton
            raise ValueError("receiving FP16 data via JSON is not supported")
        if size is not None:
            arr = np.frombuffer(binary[off : off + size], dtype=dt)
            off += size
        else:
            arr = np.asarray(inp["data"], dtype=dt).reshape(-1)
        arrays.append((inp, arr if dt == np.bool_ else arr * 2))
    want_binary = bool((doc.get("parameters") or {}).get("binary_data_output")) or any(
        (o.get("parameters") or {}).get("binary_data") for o in doc.get("outputs") or []
    )
    outputs, blobs = [], []
    for i, (inp, arr) in enumerate(arrays):
        out: dict[str, Any] = {
            "name": f"OUTPUT{i}",
            "datatype": inp["datatype"],
            "shape": inp["shape"],
        }
        if want_binary:
            if inp["datatype"] == "BYTES":
                blob = b"".join(struct.pack("<I", len(s.encode())) + s.encode() for s in arr)
            else:
                blob = np.asarray(arr).tobytes()
            out["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            out["data"] = arr if isinstance(arr, list) else np.asarray(arr).tolist()
        outputs.append(out)
    body = {"model_name": request.match_info["name"], "model_version": "1", "outputs": outputs}
    if "id" in doc:
        body["id"] = doc["id"]
    head = json.dumps(body).encode()
    headers = extra_headers(request)
    if want_binary:
        headers["Inference-Header-Content-Length"] = str(len(head))
        return web.Response(
            body=head + b"".join(blobs),
            headers=headers,
            content_type="application/octet-stream",
        )
    return web.Response(body=head, headers=headers, content_type="application/json")
