"""v2 (Open Inference Protocol) through tritonclient.http: binary and JSON tensors share a key."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tritonclient.http as httpclient

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
