"""Open Inference Protocol (KServe v2) adapter: infer requests, JSON or binary-extension tensors.

The same tensor sent as JSON data or through the binary extension gives the same key fields:
tensor contents are reduced to their raw little-endian bytes and hashed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import struct
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

import numpy as np

from backends import v2tensors
from gateway.errors import BadRequest, PayloadTooLarge
from gateway.protocols.base import Call, JSONRefused, decode_body, loads
from gateway.protocols.v2_id import with_id

INFER_PATH = re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer$")
BINARY_HEADER = v2tensors.BINARY_HEADER

DTYPES = v2tensors.V2_DTYPES
_bytes_elements = v2tensors.bytes_elements
_flatten = v2tensors.flatten
element_count = v2tensors.element_count


def _check_binary_size(name: str, datatype: str, shape: list[int], raw: bytes) -> None:
    count = element_count(name, shape)
    itemsize = v2tensors.ITEMSIZE.get(datatype)
    if itemsize is not None and count * itemsize != len(raw):
        raise BadRequest(
            f"input '{name}': shape {shape} of {datatype} needs {count * itemsize} bytes, "
            f"binary_data_size is {len(raw)}"
        )


# JSON data of these datatypes is keyed by its numbers as sent, apart from the binary form:
# Triton refuses it ("receiving FP16 data via JSON is not supported"), so the binary twin's
# cached answer was served to a request the upstream answers 400; and a server that takes it
# converts the numbers its own way (BF16 truncated or rounded, FP16 once or through FP32), so
# their bytes here are not always the tensor it reads: [1.0] and [1.005859375] were one key
# (truncated to BF16 1.0) though rounding makes them two tensors.
AS_SENT = frozenset({"FP16", "BF16"})

# the JSON value types each datatype family takes (by its first letter: INT*, UINT*, FP*, BOOL)
_JSON_TYPES: dict[str, set[type]] = {"I": {int}, "U": {int}, "F": {int, float}, "B": {bool}}


def tensor_from_json(
    name: str, datatype: str, shape: list[int], data: Any
) -> tuple[bytes, list[bytes] | None]:
    """Raw bytes of a JSON tensor in the binary extension's layout; and its strings for BYTES."""
    flat = _flatten(data)
    count = element_count(name, shape)
    if len(flat) != count:
        raise BadRequest(
            f"input '{name}': shape {shape} needs {count} elements, data has {len(flat)}"
        )
    if datatype == "BYTES":
        elems = []
        for v in flat:
            if isinstance(v, str):
                try:
                    elems.append(v.encode())
                except UnicodeEncodeError:  # JSON lets "\ud800" through
                    raise BadRequest(
                        f"input '{name}': a string is not valid Unicode (a lone surrogate)"
                    ) from None
            elif isinstance(v, bytes):
                elems.append(v)
            else:
                raise BadRequest(f"input '{name}': BYTES data must be strings")
        return b"".join(struct.pack("<I", len(e)) + e for e in elems), elems
    # JSON values of another type are refused, not coerced: numpy would truncate 1.5 to the
    # INT64 1 (or read "1" or true as 1), and that request would share the key, and the cached
    # answer, of one that sent 1
    allowed = _JSON_TYPES.get(datatype[0] if datatype != "BF16" else "F")
    if allowed is not None and not set(map(type, flat)) <= allowed:
        raise BadRequest(f"input '{name}': data does not fit datatype {datatype}")
    try:
        if datatype in AS_SENT:
            return json.dumps([float(v) for v in flat]).encode(), None
        dtype = DTYPES[datatype]
        assert dtype is not None
        return np.asarray(flat, dtype=dtype).tobytes(), None
    except (TypeError, ValueError, OverflowError):
        raise BadRequest(f"input '{name}': data does not fit datatype {datatype}") from None


class V2Adapter:
    name = "v2"
    keyed_headers: tuple[str, ...] = ()

    def __init__(self, semantic_field: str | None = None, max_items: int = 2048) -> None:
        self._semantic_field = semantic_field
        self._max_items = max_items

    def parse(
        self,
        method: str,
        path: str,
        query: str,
        content_type: str,
        body: bytes,
        headers: Mapping[str, str] | None = None,
    ) -> Call | None:
        # `path` is the raw path, as the backend gets it: the model and version are its
        # segments as sent, so /v2/models/m%2Fversions%2F3/infer is not model m's version 3
        # (the backend reads a model "m%2Fversions%2F3", or "m/versions/3"), nor is
        # .../versions/%31/infer version 1 to a backend that reads the segment as it is
        m = INFER_PATH.match(path)
        if m is None or method != "POST":
            return None
        model = unquote(m.group("name"))  # a client's quoted name, for routes' `model:`
        binary: bytes = b""
        hlen = (headers or {}).get(BINARY_HEADER) or (headers or {}).get(
            "Inference-Header-Content-Length"
        )
        if hlen is not None:
            n = v2tensors.parse_header_length(hlen, len(body))
            header, binary = body[:n], body[n:]
            try:
                doc = loads(header, allow_nan=True)
            except JSONRefused as exc:  # a key twice: see base._unique
                raise BadRequest(f"the inference header {exc}") from None
            except (ValueError, RecursionError):  # JSON, UTF-8, or an integer out of range
                raise BadRequest("the inference header is not valid JSON") from None
        else:
            doc = decode_body(content_type, body, allow_nan=True)
        if not isinstance(doc, dict):
            raise BadRequest("request body must be a JSON object")
        if "id" in doc and not isinstance(doc["id"], str):
            # Triton refuses it ("Unable to parse 'id'"); the id is not in the key, so the
            # answer cached for the same tensors under a string id was served to it instead
            raise BadRequest("'id' must be a string")
        inputs = doc.get("inputs")
        if not isinstance(inputs, list) or not inputs:
            raise BadRequest("'inputs' is required and must be a non-empty array")
        outputs = doc.get("outputs")
        for what, items in (("inputs", inputs), ("outputs", outputs)):
            # a model takes a handful of named tensors: thousands are no request a model
            # server runs, and each costs parsing and hashing (16 MiB of them, seconds of CPU)
            if isinstance(items, list) and len(items) > self._max_items:
                raise PayloadTooLarge(
                    f"the request names {len(items)} {what}; this route takes at most "
                    f"{self._max_items} per request"
                )
        key_inputs: list[dict[str, Any]] = []
        texts: dict[str, str] = {}
        offset = 0
        singles: dict[str, bool] = {}  # each BYTES input: it holds exactly one string
        names: set[str] = set()  # (a scan of the inputs before each one was quadratic)
        for i, inp in enumerate(inputs):
            if not isinstance(inp, dict):
                raise BadRequest(f"inputs[{i}] must be an object")
            name, datatype, shape = inp.get("name"), inp.get("datatype"), inp.get("shape")
            if not isinstance(name, str):
                raise BadRequest(f"inputs[{i}]: 'name' must be a string")
            if name in names:
                # inputs are named tensors: two of one name is no request a model server
                # takes, and the semantic text would be one of them, the namespace blind to both
                raise BadRequest(f"input '{name}' appears more than once")
            names.add(name)
            if not isinstance(datatype, str) or datatype not in DTYPES:
                raise BadRequest(f"input '{name}': unknown datatype {datatype!r}")
            if not isinstance(shape, list) or not all(v2tensors.is_dim(d) for d in shape):
                raise BadRequest(
                    f"input '{name}': 'shape' must be an array of non-negative integers"
                )
            if shape and shape[0] > self._max_items:
                raise PayloadTooLarge(
                    f"input '{name}' has {shape[0]} items (shape {shape[:4]}); "
                    f"this route takes at most {self._max_items} per request"
                )
            if not isinstance(inp.get("parameters") or {}, dict):
                raise BadRequest(f"input '{name}': 'parameters' must be an object")
            params = dict(inp.get("parameters") or {})
            size = params.pop("binary_data_size", None)
            if size is not None:
                # a non-negative integer; not a bool (`true` was read as 1)
                if not v2tensors.is_dim(size) or offset + size > len(binary):
                    raise BadRequest(f"input '{name}': binary_data_size does not match the body")
                raw = binary[offset : offset + size]
                offset += size
                _check_binary_size(name, datatype, shape, raw)
                elems = _bytes_elements(raw, name) if datatype == "BYTES" else None
                if elems is not None and len(elems) != element_count(name, shape):
                    raise BadRequest(
                        f"input '{name}': shape {shape} needs {element_count(name, shape)} "
                        f"elements, the BYTES data has {len(elems)}"
                    )
            else:
                if "data" not in inp:
                    raise BadRequest(f"input '{name}': 'data' is required without binary_data_size")
                raw, elems = tensor_from_json(name, datatype, shape, inp["data"])
            digest = hashlib.blake2b(raw, digest_size=16).hexdigest()
            if datatype in AS_SENT and size is None:
                digest = "json:" + digest  # the numbers as sent, never a binary twin's bytes
            if elems:
                with contextlib.suppress(UnicodeDecodeError):
                    texts[name] = elems[0].decode()
                singles[name] = len(elems) == 1
            key_inputs.append(
                {
                    "name": name,
                    "shape": shape,
                    "datatype": datatype,
                    "parameters": params,
                    "data": digest,
                }
            )
        if offset != len(binary):
            # bytes no input claims: not part of the key, but sent upstream, where a server
            # may read them into a tensor (Triton refuses them): the body is inconsistent
            raise BadRequest(
                f"the body has {len(binary) - offset} bytes after the inference header that "
                "no input's binary_data_size accounts for"
            )
        key_fields = {
            "model": m.group("name"),  # the segments as sent (the call's model is decoded)
            "version": m.group("version") or "",
            "inputs": key_inputs,
            "outputs": outputs,
            "parameters": doc.get("parameters"),
        }
        if query:
            # the query goes upstream with the request, and may carry what changes the answer
            # or whose it is (a key some servers and their auth proxies take there), as on the
            # OpenAI and Messages routes; absent, the key is as it always was
            key_fields["query"] = query
        top = doc.get("parameters")
        seq = in_sequence(top if isinstance(top, dict) else {})
        call = Call("v2", model, key_fields, deterministic=not seq, kind="infer")
        if seq:
            call.extra["bypass_reason"] = "stateful"
        version = m.group("version")
        call.extra["version"] = unquote(version) if version is not None else None
        call.extra["request_id"] = doc.get("id")
        call.extra["texts"] = texts
        if self._semantic_field is not None:
            field = self._semantic_field
            # One question per request: a batch of several strings is not one question (its
            # first string's paraphrase is no reason to serve the whole batch's answer), so it
            # has no semantic text. The text input stays in the namespace but for its data:
            # its shape, datatype and parameters must match as the other inputs do.
            call.semantic_text = texts.get(field) if singles.get(field) else None
            call.context = {k: v for k, v in key_fields.items() if k != "inputs"}
            call.context["inputs"] = [
                {**x, "data": None} if x["name"] == field else x for x in key_inputs
            ]
        return call


SEQUENCE_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end")


def in_sequence(params: Mapping[str, Any]) -> bool:
    """A request of a stateful (sequence) model: its answer depends on the requests before it
    in the sequence, so replaying a stored one would skip a step of the model's state. Triton
    reads sequence_id 0 (or "") as no sequence."""
    return any(params.get(k) not in (None, 0, "", False) for k in SEQUENCE_PARAMETERS)


def reply_with_id(
    body: bytes, headers: list[tuple[str, str]], request_id: str | None
) -> tuple[bytes, list[tuple[str, str]]] | None:
    """A stored v2 reply carries the id of the request that filled the entry; the id is not part
    of the key, so a hit must echo this request's id (or none, as the server does for a request
    without one). None when the stored reply already says what it should (or is not JSON)."""
    length: int | None = None
    for k, v in headers:
        if k.lower() == "inference-header-content-length":
            with contextlib.suppress(ValueError):
                length = int(v)
    new_head = with_id(body if length is None else body[:length], request_id)
    if new_head is None:
        return None
    if length is None:
        return new_head, headers
    fixed = [
        (k, str(len(new_head)) if k.lower() == "inference-header-content-length" else v)
        for k, v in headers
    ]
    return new_head + body[length:], fixed
