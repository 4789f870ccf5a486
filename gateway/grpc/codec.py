"""ModelInfer messages ↔ the gateway's terms: canonical tensors for the cache key, and the HTTP
v2 binary form that local engines (and HTTP v2 upstreams) speak.

A tensor sent as typed `contents` or as `raw_input_contents` reduces to the same little-endian
bytes (the v2 binary layout), so both give one key. Everything the client got wrong is a
BadRequest (INVALID_ARGUMENT) naming the tensor.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import numpy as np
from google.protobuf import json_format

from backends import v2tensors
from gateway.errors import BadRequest
from gateway.grpc.contents import contents_bytes
from gateway.grpc.proto import config_pb2, pb2

# Element sizes; BF16 has no numpy type here, BYTES no fixed size.
_ITEMSIZE = v2tensors.ITEMSIZE
V2_NUMERIC = v2tensors.V2_NUMERIC
_bytes_elements = v2tensors.bytes_elements
_CONTENTS = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}  # fmt: skip
BINARY_HEADER = "Inference-Header-Content-Length"


@dataclass(slots=True)
class Tensor:
    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, Any]
    raw: bytes  # the v2 binary layout: little-endian elements, BYTES length-prefixed


def params_of(params: Any) -> dict[str, Any]:
    """A protobuf map<string, InferParameter> → plain values."""
    out: dict[str, Any] = {}
    for k, p in params.items():
        which = p.WhichOneof("parameter_choice")
        out[k] = getattr(p, which) if which is not None else None
    return out


def _from_contents(inp: Any, count: int) -> bytes:
    name, datatype = inp.name, inp.datatype
    field = _CONTENTS.get(datatype)
    if field is None:
        raise BadRequest(f"input '{name}': {datatype} data must come in raw_input_contents")
    values = getattr(inp.contents, field)
    if len(values) != count:
        raise BadRequest(
            f"input '{name}': shape {list(inp.shape)} needs {count} elements, got {len(values)}"
        )
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(v)) + v for v in values)
    try:
        return contents_bytes(inp.contents, field, V2_NUMERIC[datatype])
    except OverflowError:
        raise BadRequest(f"input '{name}': a value does not fit {datatype}") from None


def input_tensors(req: Any) -> list[Tensor]:
    """Every input as raw bytes, checked against its datatype and shape."""
    if not req.inputs:
        raise BadRequest("a ModelInferRequest needs at least one input")
    raw_inputs = req.raw_input_contents
    if raw_inputs and len(raw_inputs) != len(req.inputs):
        raise BadRequest(
            f"raw_input_contents has {len(raw_inputs)} entries for {len(req.inputs)} inputs; "
            "send every input raw or none"
        )
    out = []
    names: set[str] = set()  # (a scan of the inputs before each one was quadratic)
    for i, inp in enumerate(req.inputs):
        name, datatype, shape = inp.name, inp.datatype, list(inp.shape)
        if not name:
            raise BadRequest(f"inputs[{i}] has no name")
        if name in names:
            raise BadRequest(f"input '{name}' appears more than once")
        names.add(name)
        if datatype != "BYTES" and datatype not in _ITEMSIZE:
            raise BadRequest(f"input '{name}': unsupported datatype {datatype!r}")
        if any(d < 0 for d in shape):
            raise BadRequest(f"input '{name}': shape {shape} has a negative dimension")
        count = math.prod(shape)
        if raw_inputs and inp.HasField("contents"):
            # Triton refuses this too; a server that read the contents would answer another
            # tensor than the one the key (which reads the raw bytes) names
            raise BadRequest(
                f"input '{name}': typed contents and raw_input_contents both given; send one"
            )
        if raw_inputs:
            raw = bytes(raw_inputs[i])
            if datatype == "BYTES":
                n = len(_bytes_elements(raw, name))
                if n != count:
                    raise BadRequest(
                        f"input '{name}': shape {shape} needs {count} elements, got {n}"
                    )
            elif len(raw) != count * _ITEMSIZE[datatype]:
                raise BadRequest(f"input '{name}': {len(raw)} bytes do not fit {datatype} {shape}")
        else:
            raw = _from_contents(inp, count)
        out.append(Tensor(name, datatype, shape, params_of(inp.parameters), raw))
    return out


def key_fields(req: Any, tensors: list[Tensor]) -> dict[str, Any]:
    """What changes the answer: version, tensors (contents hashed), requested outputs, params.
    The request id does not: it is echoed, and the gateway sets it on every answer it serves."""
    return {
        "version": req.model_version,
        "inputs": [
            {
                "name": t.name,
                "datatype": t.datatype,
                "shape": t.shape,
                "parameters": t.parameters,
                "data": hashlib.blake2b(t.raw, digest_size=16).hexdigest(),
            }
            for t in tensors
        ],
        "outputs": [{"name": o.name, "parameters": params_of(o.parameters)} for o in req.outputs],
        "parameters": params_of(req.parameters),
    }


def with_id(reply: bytes, request_id: str) -> bytes:
    """The stored reply with this request's id: protobuf keeps the last value of a repeated
    scalar field, so appending field 3 (id) overrides whatever id the first caller sent."""
    rid = request_id.encode()
    return reply + b"\x1a" + _varint(len(rid)) + rid


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def to_http_v2(req: Any, tensors: list[Tensor]) -> tuple[str, bytes, list[tuple[str, str]]]:
    """The HTTP v2 binary-extension request (path, body, headers) for the same inference."""
    doc: dict[str, Any] = {
        "inputs": [
            {
                "name": t.name,
                "datatype": t.datatype,
                "shape": t.shape,
                "parameters": {**t.parameters, "binary_data_size": len(t.raw)},
            }
            for t in tensors
        ],
        "parameters": {**params_of(req.parameters), "binary_data_output": True},
    }
    if req.outputs:
        # each output's own parameters go along (classification, ...): the engine or the HTTP
        # upstream must see them to honour or refuse them, as it would over HTTP. binary_data
        # is ours: raw_output_contents are binary whatever the client set.
        doc["outputs"] = [
            {"name": o.name, "parameters": {**params_of(o.parameters), "binary_data": True}}
            for o in req.outputs
        ]
    if req.id:
        doc["id"] = req.id
    header = json.dumps(doc).encode()
    path = model_path(req.model_name, req.model_version) + "/infer"
    headers = [("Content-Type", "application/octet-stream"), (BINARY_HEADER, str(len(header)))]
    return path, header + b"".join(t.raw for t in tensors), headers


def model_path(name: str, version: str) -> str:
    """The HTTP v2 path of a model (and version) named in a gRPC message, each one segment:
    a name is any string, and put in the path as it was, `m/versions/3` asked model m's
    version 3 (and `m/infer?` model m) under the key of another model."""
    path = f"/v2/models/{quote(name, safe='')}"
    return path + f"/versions/{quote(version, safe='')}" if version else path


def _raw_output(out: dict[str, Any]) -> bytes:
    datatype, data = out.get("datatype", ""), out.get("data", [])
    flat = np.asarray(data, dtype=object).reshape(-1).tolist() if data else []
    if datatype == "BYTES":
        elems = [v.encode() if isinstance(v, str) else bytes(v) for v in flat]
        return b"".join(struct.pack("<I", len(e)) + e for e in elems)
    return np.asarray(flat, V2_NUMERIC[datatype]).tobytes()


def from_http_v2(body: bytes, header_length: str | None, request_id: str) -> bytes:
    """An HTTP v2 infer response (JSON, or JSON + binary outputs) → serialized ModelInferResponse
    with every output in raw_output_contents, as Triton's gRPC endpoint answers."""
    binary = b""
    if header_length is not None:
        n = int(header_length)
        body, binary = body[:n], body[n:]
    doc = json.loads(body)
    resp = pb2.ModelInferResponse(
        model_name=doc.get("model_name", ""),
        model_version=str(doc.get("model_version", "")),
        id=request_id,
    )
    offset = 0
    for out in doc.get("outputs", []):
        params = dict(out.get("parameters") or {})
        size = params.pop("binary_data_size", None)
        if size is not None:
            raw = binary[offset : offset + size]
            offset += size
        else:
            raw = _raw_output(out)
        resp.outputs.add(name=out["name"], datatype=out["datatype"], shape=out["shape"])
        resp.raw_output_contents.append(raw)
    return bytes(resp.SerializeToString())


def metadata_from_json(doc: dict[str, Any]) -> bytes:
    resp = pb2.ModelMetadataResponse(
        name=doc.get("name", ""),
        versions=[str(v) for v in doc.get("versions", [])],
        platform=doc.get("platform", ""),
    )
    for side, target in (("inputs", resp.inputs), ("outputs", resp.outputs)):
        for t in doc.get(side, []):
            target.add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
    return bytes(resp.SerializeToString())


def config_from_json(doc: dict[str, Any], max_delay_ms: float | None) -> bytes:
    """A ModelConfig for a local model, from its v2 metadata: the same config HTTP's
    /v2/models/{name}/config gives (backends.v2tensors.model_config: platform and backend,
    version policy latest 1, full shapes with -1 for any size, max_batch_size 0 since the
    gateway batches requests itself)."""
    cfg = json_format.ParseDict(v2tensors.model_config(doc), config_pb2.ModelConfig())
    if max_delay_ms is not None:
        cfg.dynamic_batching.max_queue_delay_microseconds = int(max_delay_ms * 1000)
    return bytes(pb2.ModelConfigResponse(config=cfg).SerializeToString())
