"""A replay's fresh obfuscation padding (gateway/protocols/obfuscation.py), drawn in one read of
the CSPRNG: the chunks are the stored ones, and each padding is new letters of a length from 1 to
twice the stored one's, every such length occurring."""

from __future__ import annotations

import json

from gateway.protocols import obfuscation

STORED = ["abc", "", "0123456789"]


def _stream() -> list[bytes]:
    events = [
        b"data: "
        + json.dumps(
            {"id": "c", "choices": [{"delta": {"content": f"w{i}"}}], "obfuscation": p}
        ).encode()
        for i, p in enumerate(STORED)
    ]
    return [*events, b"data: [DONE]"]


def test_each_fill_keeps_the_chunks_and_draws_new_padding_of_every_length_in_range() -> None:
    tpl = obfuscation.template(_stream())
    assert tpl is not None
    seen: list[set[int]] = [set() for _ in STORED]
    for _ in range(400):
        out = obfuscation.filled(tpl)
        assert out.endswith(b"\n\ndata: [DONE]\n\n")
        docs = [json.loads(e[5:]) for e in out.split(b"\n\n") if e.startswith(b"data: {")]
        assert [d["choices"] for d in docs] == [[{"delta": {"content": f"w{i}"}}] for i in range(3)]
        for i, d in enumerate(docs):
            assert d["obfuscation"].isascii() and d["obfuscation"].isalnum()
            seen[i].add(len(d["obfuscation"]))
    assert seen == [set(range(1, max(2 * len(p), 2) + 1)) for p in STORED]
