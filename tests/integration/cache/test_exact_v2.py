"""v2 (Open Inference Protocol) through tritonclient.http: binary and JSON tensors share a key."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.cache.conftest import cache_config
from tests.support.servers import ServerThread


def _infer(url: str, arr: np.ndarray, binary: bool) -> tuple[np.ndarray, str]:
    client = httpclient.InferenceServerClient(url=url.removeprefix("http://"))
    try:
        inp = httpclient.InferInput("INPUT0", list(arr.shape), "FP32")
        inp.set_data_from_numpy(arr, binary_data=binary)
        out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
        result = client.infer("double", [inp], outputs=[out])
        resp = result.get_response()
        got = result.as_numpy("OUTPUT0")
        assert got is not None
        return got, str(resp.get("model_name"))
    finally:
        client.close()


def test_binary_and_json_tensors_share_an_entry(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url))
    arr = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    out1, _ = _infer(gw.url, arr, binary=True)
    out2, _ = _infer(gw.url, arr, binary=False)
    np.testing.assert_allclose(out1, arr * 2, rtol=1e-6)
    np.testing.assert_array_equal(out1, out2)
    stats = upstream.call(_stats(upstream.url))
    assert stats["requests"]["/v2/models/double/infer"] == 1  # the JSON request was a hit
    out3, _ = _infer(gw.url, arr + 1, binary=False)
    np.testing.assert_allclose(out3, (arr + 1) * 2, rtol=1e-6)
    assert upstream.call(_stats(upstream.url))["requests"]["/v2/models/double/infer"] == 2


async def _stats(url: str) -> dict[str, object]:
    import aiohttp

    async with aiohttp.ClientSession() as s, s.get(url + "/_test/stats") as r:
        return dict(await r.json())


def _client(url: str) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(url=url.removeprefix("http://"))


def test_a_sequence_model_is_never_answered_from_the_cache(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """Steps of a stateful model's sequence are requests the model must see, each one: a replay
    of an identical earlier step would skip it and every later answer would be wrong."""
    gw = start_gateway(cache_config(upstream.url))
    client = _client(gw.url)
    try:
        got = []
        for _ in range(2):
            for step in range(4):
                inp = httpclient.InferInput("INPUT0", [1], "FP32")
                inp.set_data_from_numpy(np.ones(1, np.float32), binary_data=False)
                res = client.infer(
                    "accumulate",
                    [inp],
                    sequence_id=42,
                    sequence_start=step == 0,
                    sequence_end=step == 3,
                )
                got.append(float(res.as_numpy("OUTPUT0")[0]))
    finally:
        client.close()
    assert got == [1, 2, 3, 4, 1, 2, 3, 4]
    assert upstream.call(_stats(upstream.url))["requests"]["/v2/models/accumulate/infer"] == 8


def test_a_hit_echoes_its_own_request_id(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(upstream.url))
    arr = np.arange(4, dtype=np.float32)
    client = _client(gw.url)
    try:
        ids = []
        for rid, binary_out in (
            ("first", False),
            ("second", False),
            ("second", False),  # the same bytes again: the alias lane must echo it too
            ("third", True),
            ("", True),
        ):
            inp = httpclient.InferInput("INPUT0", [4], "FP32")
            inp.set_data_from_numpy(arr, binary_data=True)
            out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_out)
            res = client.infer("double", [inp], outputs=[out], request_id=rid)
            np.testing.assert_allclose(res.as_numpy("OUTPUT0"), arr * 2)
            ids.append(res.get_response().get("id"))
    finally:
        client.close()
    # one upstream call per output form; the rest were hits, each with its caller's id
    assert ids == ["first", "second", "second", "third", None]
    assert upstream.call(_stats(upstream.url))["requests"]["/v2/models/double/infer"] == 2


def test_another_tenant_is_not_served_a_v2_entry_by_its_id_or_alias(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """The same v2 bytes from two tenants: each tenant its own entry, also once the alias lane
    has learned those bytes (after a hit that echoed the caller's own id)."""
    gw = start_gateway(cache_config(upstream.url))
    body = json.dumps(
        {
            "id": "r",
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}],
        }
    ).encode()

    def post(key: str) -> tuple[str, str]:
        req = urllib.request.Request(
            gw.url + "/v2/models/double/infer",
            data=body,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.headers["X-Cache"], json.loads(r.read())["id"]

    assert [post("alice") for _ in range(3)] == [("miss", "r"), ("hit", "r"), ("hit", "r")]
    assert post("bob") == ("miss", "r")
    assert upstream.call(_stats(upstream.url))["requests"]["/v2/models/double/infer"] == 2


def test_an_entry_refilled_under_another_id_still_echoes_each_callers_id(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """After a purge (or the TTL) a request with another id stores the entry again: the bytes of
    an id-"a" request, which the alias lane had learned, must not get that entry's id "b"."""
    cfg = cache_config(upstream.url)
    gw = start_gateway(cfg)
    arr = np.arange(4, dtype=np.float32)

    def infer(rid: str) -> str:
        client = _client(gw.url)
        try:
            inp = httpclient.InferInput("INPUT0", [4], "FP32")
            inp.set_data_from_numpy(arr, binary_data=False)
            out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
            res = client.infer("double", [inp], outputs=[out], request_id=rid)
            return str(res.get_response().get("id"))
        finally:
            client.close()

    assert [infer("a"), infer("a"), infer("a")] == ["a", "a", "a"]  # the alias lane knows "a"
    purge = urllib.request.Request(
        gw.url + "/admin/cache/purge",
        data=b'{"all": true}',
        method="POST",
        headers={"Authorization": f"Bearer {cfg['admin']['token']}"},
    )
    with urllib.request.urlopen(purge) as r:
        assert json.loads(r.read())["purged"]["memory"] == 1
    assert [infer("b"), infer("b")] == ["b", "b"]  # refilled under id "b"
    assert [infer("a"), infer("a")] == ["a", "a"]
    assert upstream.call(_stats(upstream.url))["requests"]["/v2/models/double/infer"] == 2


def test_a_non_string_id_is_refused_cold_and_warm(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """Triton refuses an `id` that is not a string (400 "Unable to parse 'id'"), and so does the
    test upstream. The id is not part of the key: once the same tensors were cached under a
    string id, `"id": 5` (or null) was a 200 hit, without an id, where the upstream says 400."""
    gw = start_gateway(cache_config(upstream.url))
    inputs = [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [3.0, 5.0]}]

    def post(rid: object) -> tuple[int, str | None, dict[str, object]]:
        req = urllib.request.Request(
            gw.url + "/v2/models/double/infer",
            data=json.dumps({"id": rid, "inputs": inputs}).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.headers["X-Cache"], json.loads(r.read())
        except urllib.error.HTTPError as err:
            return err.code, err.headers["X-Cache"], json.loads(err.read())

    for rid in (5, None, ["a"]):
        status, _, answer = post(rid)
        assert status == 400 and isinstance(answer["error"], str), answer  # cold
    assert post("a")[:2] == (200, "miss")
    assert post("b")[0:2] == (200, "hit") and post("b")[2]["id"] == "b"
    for rid in (5, None, ["a"]):
        status, xcache, answer = post(rid)
        assert (status, xcache) == (400, None) and "'id'" in str(answer["error"]), answer


def test_the_query_is_part_of_the_key(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """The query goes upstream with the request and may say whose it is (`?api_key=`, which
    some servers and auth proxies take) or what to answer: one tenant's answer was served to
    another query, as it is not on the OpenAI and Messages routes, which key it."""
    gw = start_gateway(cache_config(upstream.url))
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [7.0]}]}
    ).encode()

    def post(query: str) -> str:
        req = urllib.request.Request(
            gw.url + "/v2/models/double/infer" + query,
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            return str(r.headers["X-Cache"])

    assert [post("?api_key=alice"), post("?api_key=alice")] == ["miss", "hit"]
    assert [post("?api_key=bob"), post(""), post("")] == ["miss", "miss", "hit"]
    assert upstream.call(_stats(upstream.url))["requests"]["/v2/models/double/infer"] == 3


def test_fp16_as_json_is_not_its_binary_twin(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """Triton (and the test upstream) refuse FP16 data sent as JSON; tritonclient sends it so
    with binary_data=False. It was keyed as the binary tensor's bytes, so once the binary form
    was cached the JSON form was a 200 hit where the upstream answers 400."""
    gw = start_gateway(cache_config(upstream.url))
    arr = np.array([1.5, -2.0, 1000.0], dtype=np.float16)
    client = _client(gw.url)

    def infer(binary: bool) -> np.ndarray:
        inp = httpclient.InferInput("INPUT0", [3], "FP16")
        inp.set_data_from_numpy(arr, binary_data=binary)
        got = client.infer("double", [inp]).as_numpy("OUTPUT0")
        assert got is not None
        return got

    try:
        with pytest.raises(InferenceServerException, match="FP16 data via JSON"):
            infer(binary=False)  # cold
        np.testing.assert_array_equal(infer(binary=True), arr * 2)
        np.testing.assert_array_equal(infer(binary=True), arr * 2)  # a hit
        with pytest.raises(InferenceServerException, match="FP16 data via JSON"):
            infer(binary=False)  # warm: still the upstream's answer
    finally:
        client.close()
    assert upstream.call(_stats(upstream.url))["requests"]["/v2/models/double/infer"] == 3
