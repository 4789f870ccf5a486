"""A v2 hit echoes its caller's id whatever the id holds, and nothing else of the stored answer
changes: tritonclient reads the same tensors from the miss and from every hit."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.integration.cache.conftest import cache_config
from tests.support.servers import ServerThread

# quotes, backslashes, brackets, control characters, unicode (BMP and astral); "" sends none
IDS = ["miss", 'quo"te', "back\\slash\\", "}],{[", "new\nline\ttab", "é ü 😀 \u2028", "", "miss"]
TEXTS = np.array([b'a]"[', b"\\", b"}{", b'"', b"]", "é😀".encode(), b"plain"], dtype=object)


def _infer(client: httpclient.InferenceServerClient, rid: str, binary: bool) -> dict[str, object]:
    floats = np.arange(2048, dtype=np.float32) / 7
    a = httpclient.InferInput("INPUT0", [2048], "FP32")
    a.set_data_from_numpy(floats, binary_data=True)
    b = httpclient.InferInput("INPUT1", [len(TEXTS)], "BYTES")
    b.set_data_from_numpy(TEXTS, binary_data=True)
    outs = [httpclient.InferRequestedOutput(f"OUTPUT{i}", binary_data=binary) for i in (0, 1)]
    res = client.infer("double", [a, b], outputs=outs, request_id=rid)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), floats * 2)
    texts = res.as_numpy("OUTPUT1")
    assert texts is not None
    # (JSON outputs read as str, binary ones as bytes)
    got = [t if isinstance(t, bytes) else str(t).encode() for t in texts]
    assert got == [t.decode().upper().encode() for t in TEXTS]
    return dict(res.get_response())


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_each_hit_echoes_its_own_id_and_the_stored_answer(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread], binary: bool
) -> None:
    gw = start_gateway(cache_config(upstream.url))
    client = httpclient.InferenceServerClient(url=gw.url.removeprefix("http://"))
    try:
        answers = [_infer(client, rid, binary) for rid in IDS]
    finally:
        client.close()
    assert [a.get("id") for a in answers] == [rid or None for rid in IDS]
    # the rest of each answer is the miss's
    first = {k: v for k, v in answers[0].items() if k != "id"}
    assert all({k: v for k, v in a.items() if k != "id"} == first for a in answers)
    assert upstream.call(_requests(upstream.url)) == 1  # every later call was a hit


async def _requests(url: str) -> object:
    import aiohttp

    async with aiohttp.ClientSession() as s, s.get(url + "/_test/stats") as r:
        return (await r.json())["requests"]["/v2/models/double/infer"]
