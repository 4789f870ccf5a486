"""Open Inference Protocol v2 tensors for local engines: decode infer requests, encode responses.

JSON `data` and the binary tensor extension both work, in and out (tritonclient uses binary by
default); a body without the extension may be msgpack, as the cache key reads it (backends.bodies).
Everything the client got wrong is a BadInput naming the tensor and the problem, and so is an
output parameter this codec does not honour (the classification extension's `classification`,
shared memory): ignoring it would answer another question than the one asked.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from backends.bodies import load_document
from backends.errors import BadInput
from backends.v2json import data_json
from backends.v2tensors import (
    BINARY_HEADER,
    V2_NUMERIC,
    bytes_elements,
    element_count,
    flatten,
    is_dim,
    parse_header_length,
)

NUMERIC = V2_NUMERIC
__all__ = ["BINARY_HEADER", "OUTPUT_PARAMETERS", "InferRequest", "decode_infer", "encode_infer"]
# The output parameters encode_infer honours; any other is refused, not ignored.
OUTPUT_PARAMETERS = frozenset({"binary_data"})


@dataclass(slots=True)
class InferRequest:
    id: str | None
    inputs: dict[str, tuple[str, list[int], Any]]  # name → (datatype, shape, array or list[bytes])
    binary_outputs: set[str]
    requested: list[str] | None  # output names asked for; None = all
    binary_default: bool


def decode_infer(
    body: bytes, header_length: str | None, content_type: str | None = None
) -> InferRequest:
    binary = b""
    if header_length is not None:
        n = parse_header_length(header_length, len(body))
        body, binary = body[:n], body[n:]
        content_type = None  # the extension's header is JSON whatever the body's type says
    doc = load_document(content_type, body, "the inference request")
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list) or not doc["inputs"]:
        raise BadInput("'inputs' is required and must be a non-empty array")
    inputs: dict[str, tuple[str, list[int], Any]] = {}
    offset = 0
    for i, inp in enumerate(doc["inputs"]):
        if not isinstance(inp, dict) or not isinstance(inp.get("name"), str):
            raise BadInput(f"inputs[{i}] must be an object with a string 'name'")
        name, datatype, shape = inp["name"], inp.get("datatype"), inp.get("shape")
        if name in inputs:  # (the last one would silently win)
            raise BadInput(f"input '{name}' is given twice")
        if datatype != "BYTES" and datatype not in NUMERIC:
            raise BadInput(f"input '{name}': unsupported datatype {datatype!r}")
        if not isinstance(shape, list) or not all(is_dim(d) for d in shape):
            raise BadInput(f"input '{name}': 'shape' must be an array of non-negative integers")
        count = element_count(name, shape)
        in_params = inp.get("parameters") or {}
        if not isinstance(in_params, dict):  # (on a passthrough route no adapter looked first)
            raise BadInput(f"input '{name}': 'parameters' must be an object")
        size = in_params.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(binary):
                raise BadInput(f"input '{name}': binary_data_size does not match the body")
            raw = binary[offset : offset + size]
            offset += size
            if datatype == "BYTES":
                value: Any = bytes_elements(raw, name)
            else:
                dt = NUMERIC[datatype]
                if len(raw) != count * dt.itemsize:
                    raise BadInput(f"input '{name}': {len(raw)} bytes do not fit shape {shape}")
                value = _shaped(np.frombuffer(raw, dt), shape, name)
        else:
            if "data" not in inp:
                raise BadInput(f"input '{name}': 'data' is required without binary_data_size")
            flat = flatten(inp["data"])
            if datatype == "BYTES":
                # msgpack's bin elements are taken as they are: the key hashes them as the
                # same string's UTF-8, so refusing them would refuse only on a miss
                if not all(isinstance(v, str | bytes) for v in flat):
                    raise BadInput(f"input '{name}': BYTES data must be strings")
                try:
                    value = [v.encode() if isinstance(v, str) else v for v in flat]
                except UnicodeEncodeError:  # JSON lets "\ud800" through
                    raise BadInput(
                        f"input '{name}': a string is not valid Unicode (a lone surrogate)"
                    ) from None
            else:
                try:
                    value = np.asarray(flat, NUMERIC[datatype])
                except (TypeError, ValueError, OverflowError):
                    raise BadInput(
                        f"input '{name}': data does not fit datatype {datatype}"
                    ) from None
                if value.size == count:
                    value = _shaped(value, shape, name)
        n_elems = len(value) if isinstance(value, list) else int(value.size)
        if n_elems != count:
            raise BadInput(f"input '{name}': shape {shape} needs {count} elements, got {n_elems}")
        inputs[name] = (datatype, shape, value)
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadInput("'parameters' must be an object")
    binary_default = _flag(params, "binary_data_output", False, "'parameters'")
    outs = doc.get("outputs")
    if outs is not None and not isinstance(outs, list):
        # (read as "all outputs" before; Triton refuses it, and the key holds it as sent)
        raise BadInput("'outputs' must be an array of objects")
    requested: list[str] | None = None
    bin_outs: set[str] = set()
    if isinstance(outs, list):
        requested = []
        for o in outs:
            if not isinstance(o, dict) or not isinstance(o.get("name"), str):
                raise BadInput("each of 'outputs' must be an object with a string 'name'")
            if o["name"] in requested:
                # each one was answered in full: 50,000 of one name in a 1 MB body made a
                # 400 MB answer (and Triton refuses an output asked for twice)
                raise BadInput(f"output '{o['name']}' is requested more than once")
            requested.append(o["name"])
            o_params = o.get("parameters") or {}
            if not isinstance(o_params, dict):
                raise BadInput(f"output '{o['name']}': 'parameters' must be an object")
            _check_output_parameters(o["name"], o_params)
            if _flag(o_params, "binary_data", binary_default, f"output '{o['name']}'"):
                bin_outs.add(o["name"])
    rid = doc.get("id")
    return InferRequest(rid if isinstance(rid, str) else None, inputs, bin_outs, requested,
                        binary_default)  # fmt: skip


def _shaped(flat: np.ndarray, shape: list[int], name: str) -> np.ndarray:
    """The elements in their shape. numpy refuses a shape whose other dimensions overflow its
    index type even when one of them is 0 ([0, 2**62] holds no element, but is "too big"): a
    ValueError that was a 500 over HTTP and UNKNOWN over gRPC."""
    try:
        return flat.reshape(shape)
    except ValueError:
        raise BadInput(f"input '{name}': shape {shape} is too large for a tensor") from None


def _flag(params: dict[Any, Any], name: str, default: bool, where: str) -> bool:
    """A boolean parameter, as Triton reads it: `"binary_data": "false"` (or 0, or -1) was
    truthy here, and its client, expecting JSON, got the binary extension it cannot parse."""
    value = params.get(name, default)
    if not isinstance(value, bool):
        raise BadInput(f"{where}: parameter '{name}' must be true or false, got {value!r}")
    return value


def _check_output_parameters(name: str, params: dict[Any, Any]) -> None:
    unknown = sorted(str(k) for k in params if k not in OUTPUT_PARAMETERS)
    if not unknown:
        return
    if "classification" in unknown:
        raise BadInput(
            f"output '{name}': parameter 'classification' (class_count) is not supported: "
            "local models do not implement the classification extension; "
            "request the raw output and rank it client-side"
        )
    raise BadInput(
        f"output '{name}': unsupported parameter {', '.join(map(repr, unknown))}; "
        f"local models honour only {', '.join(map(repr, sorted(OUTPUT_PARAMETERS)))}"
    )


def encode_infer(
    model: str, req: InferRequest, outputs: dict[str, tuple[str, NDArray[Any]]]
) -> tuple[bytes, list[tuple[str, str]]]:
    """JSON response, or the binary extension when any requested output asked for it.

    Numeric JSON data is written by backends.v2json (the same numbers, ~15x faster than
    json.dumps); the rest of the document is json.dumps's, as it always was."""
    names = req.requested if req.requested is not None else list(outputs)
    # the header's pieces, joined once: the data of a large output is tens of megabytes
    pieces = [json.dumps({"model_name": model, "model_version": "1"}).encode()[:-1]]
    pieces.append(b', "outputs": [')
    blobs = []
    for i, name in enumerate(names):
        if name not in outputs:
            raise BadInput(f"model {model} has no output '{name}' (it has {', '.join(outputs)})")
        datatype, arr = outputs[name]
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(arr.shape)}
        binary = name in req.binary_outputs or (req.requested is None and req.binary_default)
        pieces.append(b", " if i else b"")
        if binary:
            if datatype == "BYTES":
                blob = _bytes_blob(arr)
            else:
                blob = np.ascontiguousarray(arr, NUMERIC[datatype]).tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
            pieces.append(json.dumps(entry).encode())
            continue
        if datatype == "BYTES":
            data = json.dumps([_text(v) for v in arr.reshape(-1).tolist()]).encode()
        else:
            data = data_json(arr)
        pieces += [json.dumps(entry).encode()[:-1], b', "data": ', data, b"}"]
    pieces.append(b"]")
    pieces.append(b"}" if req.id is None else b', "id": ' + json.dumps(req.id).encode() + b"}")
    header = b"".join(pieces)
    if not blobs:
        return header, [("Content-Type", "application/json")]
    return header + b"".join(blobs), [
        ("Content-Type", "application/octet-stream"),
        ("Inference-Header-Content-Length", str(len(header))),
    ]


def _bytes_blob(arr: NDArray[Any]) -> bytes:
    """A string tensor (ONNX Runtime gives str objects) in the binary extension's BYTES
    layout: each element a little-endian u32 length, then its UTF-8."""
    elements = [v.encode() if isinstance(v, str) else bytes(v) for v in arr.reshape(-1).tolist()]
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else bytes(value).decode("utf-8", "replace")
