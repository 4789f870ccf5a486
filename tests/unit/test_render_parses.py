"""Whether a stored JSON answer parses (gateway/render.py `_parses`, the rule that keeps a
well-framed broken answer out of the cache) reads answers as the clients' json.loads does:
orjson first, for speed, and json.loads for what orjson refuses beside JSON proper."""

from __future__ import annotations

import json

import pytest

from gateway.render import _parses

WHOLE = json.dumps({"object": "list", "data": [{"embedding": [0.5] * 8, "index": 0}]}).encode()


@pytest.mark.parametrize(
    "body",
    [
        WHOLE,
        b'{"score": NaN, "other": Infinity}',  # json.loads (the Python SDKs) takes these
        b'{"text": "\\ud800 a lone surrogate"}',
        '{"text": "caf\u00e9"}'.encode(),
    ],
)
def test_what_json_loads_reads_parses(body: bytes) -> None:
    json.loads(body)  # (the reference)
    assert _parses(body)


@pytest.mark.parametrize(
    "body",
    [WHOLE[:-1], WHOLE[: len(WHOLE) // 2], b"", b"<html>login</html>", b'{"a": "\xff"}'],
)
def test_what_json_loads_refuses_does_not(body: bytes) -> None:
    with pytest.raises(ValueError):
        json.loads(body)
    assert not _parses(body)
