"""The v2 adapter's key fields: which requests share an entry and which do not."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from gateway.protocols.v2 import V2Adapter


def _fields(data: Any, datatype: str, *, path: str = "/v2/models/m/infer", query: str = "") -> Any:
    doc = {"inputs": [{"name": "x", "datatype": datatype, "shape": [len(data)], "data": data}]}
    call = V2Adapter().parse("POST", path, query, "application/json", json.dumps(doc).encode())
    assert call is not None
    return call.key_fields


def _binary_fields(raw: bytes, datatype: str, count: int) -> Any:
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": datatype,
                    "shape": [count],
                    "parameters": {"binary_data_size": len(raw)},
                }
            ]
        }
    ).encode()
    headers = {"inference-header-content-length": str(len(head))}
    call = V2Adapter().parse("POST", "/v2/models/m/infer", "", "", head + raw, headers)
    assert call is not None
    return call.key_fields


def test_fp32_json_and_binary_share_a_key_fp16_and_bf16_do_not() -> None:
    values = [1.5, -2.0, 3.25]
    fp32 = np.asarray(values, "<f4").tobytes()
    assert _fields(values, "FP32") == _binary_fields(fp32, "FP32", 3)
    fp16 = np.asarray(values, "<f2").tobytes()
    assert _fields(values, "FP16") != _binary_fields(fp16, "FP16", 3)


def test_bf16_json_numbers_that_truncate_alike_are_two_keys() -> None:
    """1.005859375 truncates to BF16 1.0 but rounds to the next BF16 value: a server that
    rounds reads two tensors, so they are two keys; 1 and 1.0 are one number."""
    assert _fields([1.0], "BF16") != _fields([1.005859375], "BF16")
    assert _fields([1.0], "BF16") == _fields([1], "BF16")


def test_the_path_as_sent_and_the_query_are_in_the_key() -> None:
    plain = _fields([1.0], "FP32", path="/v2/models/m/versions/1/infer")
    assert _fields([1.0], "FP32", path="/v2/models/m/versions/%31/infer") != plain
    assert _fields([1.0], "FP32", path="/v2/models/m%2Fversions%2F1/infer") != plain
    assert _fields([1.0], "FP32", path="/v2/models/m/versions/1/infer", query="k=a") != plain
    assert "query" not in plain  # no query: the key as it always was
