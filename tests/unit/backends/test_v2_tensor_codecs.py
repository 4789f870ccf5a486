"""The fast v2 tensor conversions give what the plain ones gave: JSON data written by orjson
parses to json.dumps's numbers (NaN, ±Infinity, -0.0, subnormals, integer extremes, booleans),
typed gRPC contents read from their packed bytes or np.fromiter are list()+np.asarray's, and a
local engine's JSON body read by orjson is json.loads's document."""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import numpy as np
import pytest

from backends.bodies import load_document
from backends.errors import BadInput
from backends.local.v2codec import InferRequest, encode_infer
from backends.v2json import SLICE, data_json
from backends.v2tensors import V2_NUMERIC, flatten
from gateway.grpc.codec import input_tensors
from gateway.grpc.proto import pb2

# Enough elements to cross orjson slices, with the odd values at both ends of a slice.
SIZE = 2 * SLICE + 17


def _values(datatype: str, rng: np.random.Generator) -> np.ndarray:
    dt = V2_NUMERIC[datatype]
    if datatype == "BOOL":
        return rng.integers(0, 2, SIZE).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        out = rng.integers(info.min, info.max, SIZE, dtype=dt, endpoint=True)
        out[:3] = [info.min, info.max, 0]
        out[SLICE - 1 : SLICE + 1] = [info.max, info.min]
        return out
    f = np.finfo(dt)
    half = f.maxexp // 2  # (magnitudes from 2**-half to 2**half: exponents in the text too)
    out = np.ldexp(rng.standard_normal(SIZE), rng.integers(-half, half, SIZE)).astype(dt)
    special = [np.nan, np.inf, -np.inf, -0.0, 0.0, f.smallest_subnormal, -f.smallest_subnormal,
               f.tiny, f.max, f.min, f.eps]  # fmt: skip
    out[: len(special)] = special
    out[SLICE - 2 : SLICE + 2] = [np.nan, f.smallest_subnormal * 3, -np.inf, f.max]
    return out


def _old_encode(
    model: str, req: InferRequest, outputs: dict[str, tuple[str, np.ndarray]]
) -> tuple[bytes, list[tuple[str, str]]]:
    """encode_infer as it was: json.dumps of the document, data from tolist()."""
    entries, blobs = [], []
    for name, (datatype, arr) in outputs.items():
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(arr.shape)}
        if req.binary_default:
            blob = _bytes_blob(arr) if datatype == "BYTES" else arr.tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        elif datatype == "BYTES":
            entry["data"] = [str(v) for v in arr.reshape(-1).tolist()]
        else:
            entry["data"] = arr.reshape(-1).tolist()
        entries.append(entry)
    doc: dict[str, Any] = {"model_name": model, "model_version": "1", "outputs": entries}
    if req.id is not None:
        doc["id"] = req.id
    header = json.dumps(doc).encode()
    if not blobs:
        return header, [("Content-Type", "application/json")]
    return header + b"".join(blobs), [
        ("Content-Type", "application/octet-stream"),
        ("Inference-Header-Content-Length", str(len(header))),
    ]


def _bytes_blob(arr: np.ndarray) -> bytes:
    elements = [str(v).encode() for v in arr.reshape(-1).tolist()]
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def _same(a: Any, b: Any) -> bool:
    """Equal JSON values, NaN equal to NaN, -0.0 apart from 0.0, 1 apart from 1.0 and True."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float):
        if math.isnan(a):
            return math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return bool(a == b)


@pytest.mark.parametrize("datatype", sorted(V2_NUMERIC))
def test_json_data_parses_to_the_numbers_json_dumps_wrote(datatype: str) -> None:
    arr = _values(datatype, np.random.default_rng(len(datatype)))
    new = json.loads(data_json(arr))
    assert _same(new, json.loads(json.dumps(arr.tolist())))
    # as tritonclient reads JSON data: the same bits in the datatype
    back = np.asarray(new, V2_NUMERIC[datatype])
    assert back.tobytes() == arr.astype(V2_NUMERIC[datatype]).tobytes()


def test_nan_and_infinity_are_written_as_json_dumps_writes_them() -> None:
    arr = np.array([np.nan, np.inf, -np.inf, 1.5, -0.0], np.float32)
    assert data_json(arr) == b"[NaN,Infinity,-Infinity,1.5,-0.0]"
    assert data_json(np.array([], np.float32)) == b"[]"


@pytest.mark.parametrize("binary", [False, True])
def test_a_whole_answer_is_the_one_written_before(binary: bool) -> None:
    rng = np.random.default_rng(3)
    outputs = {
        "scores": ("FP32", _values("FP32", rng).reshape(-1, 1)),
        "half": ("FP16", _values("FP16", rng)),
        "ids": ("INT64", _values("INT64", rng)),
        "flags": ("BOOL", _values("BOOL", rng)),
        "label": ("BYTES", np.array(["été", "", "\u2603 snow", 'a"b\\c'], object)),
    }
    for rid in ("r-\u00e9\ud800", None):  # (a lone surrogate: json.dumps escapes it)
        req = InferRequest(rid, {}, set(), None, binary)
        body, headers = encode_infer("m", req, outputs)
        old_body, old_headers = _old_encode("m", req, outputs)
        if binary:  # the header is json.dumps's, byte for byte, and so are the tensors
            assert (body, headers) == (old_body, old_headers)
        else:
            assert headers == old_headers
            assert _same(json.loads(body), json.loads(old_body))


_CONTENTS = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents",
}  # fmt: skip


@pytest.mark.parametrize("datatype", sorted(_CONTENTS))
def test_typed_grpc_contents_give_list_and_asarrays_bytes(datatype: str) -> None:
    arr = _values(datatype, np.random.default_rng(len(datatype) + 1))
    msg = pb2.ModelInferRequest(model_name="m")
    inp = msg.inputs.add(name="x", datatype=datatype, shape=[SIZE])
    field = getattr(inp.contents, _CONTENTS[datatype])
    field.extend(arr.tolist())
    # (a field of another type alongside: only the datatype's own is read, as before)
    other = "bytes_contents" if datatype != "BOOL" else "int_contents"
    getattr(inp.contents, other).extend([b"x"] if other == "bytes_contents" else [7])
    parsed = pb2.ModelInferRequest.FromString(msg.SerializeToString())
    (tensor,) = input_tensors(parsed)
    contents = getattr(parsed.inputs[0].contents, _CONTENTS[datatype])
    assert tensor.raw == np.asarray(list(contents), V2_NUMERIC[datatype]).tobytes()
    assert tensor.raw == arr.tobytes()


_BODIES = [
    b'{"data": [1.5, -0.0, 1e-7, 5e-324, 1.7976931348623157e308, 0.30000000000000004]}',
    b'{"data": [NaN, Infinity, -Infinity, 1e400, -1e400]}',
    b'{"data": [9223372036854775807, -9223372036854775808, 18446744073709551615]}',
    b'{"data": [-9999999999999999999, -9223372036854775809, 18446744073709551616, 1]}',
    b'{"data": [0.12345678901234567891, 123456789012345678901234567890e-10]}',
    b'{"data": [0.00012345678901234567, 0.00012345678901234567, -18446744073709551616]}',
    b"12345678901234567890123",
    b'{"data": [1e0000000000000000000001, "1234567890123456789012"]}',
    b'{"s": "\\ud800", "t": "\\u00e9\\ud83d\\ude00"}',
    b'{"a": 1, "a": [2, [3, [4]]]}',
    b'{"data": [[1, 2], [3, [4, 5]], [], true, null, "x"]}',
    b"[" * 3000 + b"]" * 3000,
]


@pytest.mark.parametrize("body", _BODIES, ids=range(len(_BODIES)))
def test_a_local_json_body_is_read_as_json_loads_reads_it(body: bytes) -> None:
    try:
        want: Any = json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError):
        with pytest.raises(BadInput):
            load_document("application/json", body, "the body")
        return
    assert _same(load_document("application/json", body, "the body"), want)


@pytest.mark.parametrize("body", [b"[1, 2,]", b"\xef\xbb\xbf[1]", b'["\xff"]', b"[01]", b""])
def test_a_body_json_loads_refuses_is_still_refused(body: bytes) -> None:
    with pytest.raises(BadInput):
        load_document(None, body, "the body")


def test_flatten_reads_nested_and_flat_data_alike() -> None:
    def old(data: Any) -> list[Any]:
        if isinstance(data, list):
            return [y for x in data for y in old(x)]
        return [data]

    for data in ([1, 2.5, True, None, "x"], [[1, 2], [3, [4, [5]]], []], [], 7, [[[]]]):
        assert flatten(data) == old(data)
