"""A v2 hit's id splice gives the keys and values the full parse (json.loads + json.dumps of
the whole header, the code before the splice) gives, on the bodies that could trip it."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from gateway.protocols.v2 import reply_with_id
from gateway.protocols.v2_id import with_id

OUTPUTS = '"outputs":[{"name":"OUT","datatype":"FP32","shape":[2],"data":[1.5,-2e-3]}]'
BODIES = [
    "{}",
    '{"id":"only"}',
    '{ "id" : "only, spaced" }',
    " \n{ } \r\n",
    '{"model_name":"m",' + OUTPUTS + "}",
    '{"id":"first","model_name":"m",' + OUTPUTS + "}",
    '{"model_name":"m","id":"middle",' + OUTPUTS + "}",
    '{"model_name": "m", "model_version": "1", ' + OUTPUTS + ', "id": "last"}',
    '{\n  "model_name" : "m" ,\n  "id" : "spaced" ,\n  ' + OUTPUTS + "\n}\n",
    # ids that hold quotes, escapes, brackets, unicode (escaped and raw), an escaped key
    r'{"id":"a\"b\\c\/d\n}],{[","x":1}',
    '{"id":"\\u00e9\\ud83d\\ude00","x":1}',
    '{"id":"é😀","x":1}',
    r'{"\u0069d":"escaped key","x":1}',
    r'{"i\"d":"not the id","x":1}',
    # a repeated id: the last is the one a parser keeps
    '{"id":"one","x":1,"id":"two"}',
    # ids that are not strings (an upstream's own)
    '{"id":null,"x":1}',
    '{"id":5,"x":[1]}',
    '{"x":1,"id":{"a":["}"]}}',
    # nested ids and strings full of brackets, quotes and backslashes stay as they are
    '{"outputs":[{"id":"nested","data":["a]\\"[","\\\\","}{","\\"","]"]}],"id":"top"}',
    '{"outputs":[{"data":[[1,2],[3,4]],"parameters":{"id":"p"}}],"m":"]}"}',
    '{"outputs":[{"data":["[","[","{"]}],"id":"after brackets in strings"}',
    # values json reads as it always did: NaN, infinities, big and negative-zero numbers
    '{"data":[NaN,Infinity,-Infinity,1e400,-0.0,123456789012345678901234567890],"t":true}',
    '{"t":NaN,"id":"n"}',
    # not an object, not JSON, or more than one document: served as stored
    "[1,2]",
    '"id"',
    "",
    '{"id":"a"',
    '{"id":"a",}',
    '{"id":"a"} {"id":"b"}',
    '{"x":[1,2}',
    '{"x":"open}',
    '{"id":tru}',
    '{"x":"\x01"}',
    '\ufeff{"id":"bom","x":1}',
]
IDS: list[str | None] = [
    None,
    "first",
    "new",
    'quo"te',
    "back\\slash",
    "\u00e9\U0001f600",
    "\ud800",
    "}],{[",
    "",
    "\n\t",
]


def _same(a: bytes | None, b: bytes | None) -> None:
    assert (a is None) == (b is None)
    if a is None or b is None:
        return
    da: Any = json.loads(a)
    db: Any = json.loads(b)
    # (dumps: NaN equals itself there; keys in order: the id first)
    assert json.dumps(da) == json.dumps(db)
    assert list(da) == list(db)


def _full_parse(head: bytes, request_id: str | None) -> bytes | None:
    """The code before the splice."""
    try:
        doc = json.loads(head)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("id") == request_id:
        return None
    if request_id is None:
        doc.pop("id", None)
    else:
        doc = {"id": request_id, **{k: v for k, v in doc.items() if k != "id"}}
    return json.dumps(doc, separators=(",", ":")).encode()


@pytest.mark.parametrize("body", BODIES)
@pytest.mark.parametrize("request_id", IDS)
def test_the_splice_says_what_the_full_parse_says(body: str, request_id: str | None) -> None:
    head = body.encode("utf-8", "surrogatepass")
    _same(with_id(head, request_id), _full_parse(head, request_id))


def test_a_large_header_keeps_its_tensor_bytes_as_stored() -> None:
    data = ", ".join(f"{i / 7:.9g}" for i in range(50_000))
    head = f'{{"model_name": "m", "outputs": [{{"data": [{data}]}}], "id": "old"}}'.encode()
    out = with_id(head, 'ne"w')
    assert out is not None
    assert out.startswith(b'{"id":"ne\\"w",') and f"[{data}]".encode() in out
    _same(out, _full_parse(head, 'ne"w'))


def test_a_binary_reply_keeps_its_tensors_and_says_its_new_header_length() -> None:
    head = b'{"outputs":[{"name":"O","parameters":{"binary_data_size":4}}],"id":"a"}'
    blob = b'\x00{"id"'[:4]
    headers = [("Content-Type", "application/octet-stream")]
    headers.append(("Inference-Header-Content-Length", str(len(head))))
    out = reply_with_id(head + blob, headers, "b\u00e9")
    assert out is not None
    body, fixed = out
    length = int(dict(fixed)["Inference-Header-Content-Length"])
    assert json.loads(body[:length])["id"] == "b\u00e9" and body[length:] == blob
    assert reply_with_id(head + blob, headers, "a") is None


def _value(rng: random.Random, depth: int) -> Any:
    kind = rng.randrange(7 if depth < 3 else 4)
    if kind == 0:
        return "".join(rng.choice(_LETTERS) for _ in range(rng.randrange(6)))
    if kind == 1:
        return rng.choice([0, -1, 2.5e-8, 1e300, True, False, None])
    if kind in (2, 3):
        return rng.choice(["id", "x", 'q"', "\\"])
    if kind in (4, 5):
        return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {_key(rng): _value(rng, depth + 1) for _ in range(rng.randrange(4))}


def _key(rng: random.Random) -> str:
    return rng.choice(["id", "outputs", "data", "x", "i\\d", "[", "é"])


_LETTERS = 'ab"\\/[]{}:,é😀\n\t\u2028 '


@pytest.mark.parametrize("seed", range(40))
def test_generated_bodies_read_as_the_full_parse_reads_them(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(25):
        doc = {_key(rng): _value(rng, 0) for _ in range(rng.randrange(5))}
        indent = rng.choice([None, 1])
        head = json.dumps(doc, ensure_ascii=rng.random() < 0.5, indent=indent).encode()
        for request_id in (None, "id", rng.choice(IDS)):
            _same(with_id(head, request_id), _full_parse(head, request_id))


@pytest.mark.parametrize("text", ["a", "]}[{", 'q\\"]'])
def test_data_as_nested_lists_is_skipped_whole(text: str) -> None:
    """Hundreds of brackets (past the ones read one by one), strings holding brackets."""
    rows = [[i, text if i > 300 else "a", {"id": "nested", "x": [[]]}] for i in range(400)]
    for doc in ({"outputs": [{"data": rows}], "id": "old"}, {"id": "old", "data": rows}):
        head = json.dumps(doc).encode()
        for request_id in (None, "old", 'ne"w'):
            _same(with_id(head, request_id), _full_parse(head, request_id))
    head = json.dumps({"data": rows}).encode()
    assert with_id(head + b"]", "x") is None and with_id(head[:-2] + b"}", "x") is None
