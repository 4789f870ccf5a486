"""gRPC v2 codec: one key for one tensor however it is sent, ids on stored replies, bad input."""

from __future__ import annotations

import re

import numpy as np
import pytest

from backends import BadInput
from gateway.errors import BadRequest
from gateway.grpc import codec
from gateway.grpc.proto import pb2


def _typed() -> pb2.ModelInferRequest:
    req = pb2.ModelInferRequest(model_name="m", id="1")
    t = req.inputs.add(name="x", datatype="INT64", shape=[2, 2])
    t.contents.int64_contents.extend([1, 2, 3, 4])
    s = req.inputs.add(name="s", datatype="BYTES", shape=[2])
    s.contents.bytes_contents.extend([b"ab", b""])
    return req


def _raw() -> pb2.ModelInferRequest:
    req = pb2.ModelInferRequest(model_name="m", id="2")
    req.inputs.add(name="x", datatype="INT64", shape=[2, 2])
    req.inputs.add(name="s", datatype="BYTES", shape=[2])
    req.raw_input_contents.append(np.arange(1, 5, dtype="<i8").tobytes())
    req.raw_input_contents.append(b"\x02\x00\x00\x00ab\x00\x00\x00\x00")
    return req


def test_typed_and_raw_contents_give_one_key_and_the_id_does_not_count() -> None:
    typed, raw = _typed(), _raw()
    assert codec.key_fields(typed, codec.input_tensors(typed)) == codec.key_fields(
        raw, codec.input_tensors(raw)
    )
    other = _raw()
    other.raw_input_contents[0] = np.arange(2, 6, dtype="<i8").tobytes()
    assert codec.key_fields(other, codec.input_tensors(other)) != codec.key_fields(
        raw, codec.input_tensors(raw)
    )


@pytest.mark.parametrize("rid", ["", "new-id", "x" * 300])
def test_with_id_overrides_the_stored_id(rid: str) -> None:
    stored = pb2.ModelInferResponse(model_name="m", id="first-caller").SerializeToString()
    assert pb2.ModelInferResponse.FromString(codec.with_id(stored, rid)).id == rid


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.raw_input_contents.pop(), "raw_input_contents has 1 entries for 2 inputs"),
        (lambda r: r.inputs[0].shape.append(2), "32 bytes do not fit INT64 [2, 2, 2]"),
        (lambda r: setattr(r.inputs[0], "datatype", "INT3"), "unsupported datatype 'INT3'"),
        (lambda r: r.raw_input_contents.__setitem__(1, b"\x09\x00\x00\x00ab"), "runs past"),
        (lambda r: r.inputs[1].shape.__setitem__(0, 3), "needs 3 elements, got 2"),
        (lambda r: r.inputs[0].contents.int64_contents.extend([9, 9, 9, 9]), "both given"),
        (lambda r: r.inputs[1].contents.SetInParent(), "both given"),  # set, if empty
    ],
)
def test_bad_tensors_name_the_problem(mutate: object, message: str) -> None:
    req = _raw()
    mutate(req)  # type: ignore[operator]
    with pytest.raises((BadRequest, BadInput), match=re.escape(message)):
        codec.input_tensors(req)


def test_http_v2_round_trip_keeps_tensors_raw() -> None:
    req = _raw()
    path, body, headers = codec.to_http_v2(req, codec.input_tensors(req))
    assert path == "/v2/models/m/infer"
    header_len = int(dict(headers)[codec.BINARY_HEADER])
    assert body[header_len:] == b"".join(req.raw_input_contents)
    answer = (
        b'{"model_name":"m","model_version":"1","outputs":[{"name":"y","datatype":"FP32",'
        b'"shape":[2],"parameters":{"binary_data_size":8}},{"name":"z","datatype":"INT32",'
        b'"shape":[1],"data":[7]}]}'
    )
    blob = np.asarray([1.5, 2.5], "<f4").tobytes()
    resp = pb2.ModelInferResponse.FromString(
        codec.from_http_v2(answer + blob, str(len(answer)), "2")
    )
    assert resp.id == "2" and [o.name for o in resp.outputs] == ["y", "z"]
    assert list(resp.raw_output_contents) == [blob, np.asarray([7], "<i4").tobytes()]
