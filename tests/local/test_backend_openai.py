"""/v1/embeddings on a local engine through the real openai SDK, and the errors users see."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import openai
import pytest

from backends.local.text_encoder import TextEncoder
from tests.local.conftest import SENTENCES, http, st_encode
from tests.support.servers import ServerThread


def _client(gw: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("fmt", ["base64", "float"])
def test_sdk_embeddings_equal_sentence_transformers(
    local_gateway: ServerThread, reference: Any, fmt: str
) -> None:
    kwargs: dict[str, Any] = {} if fmt == "base64" else {"encoding_format": "float"}
    res = _client(local_gateway).embeddings.create(
        model="all-MiniLM-L6-v2", input=SENTENCES[:5], **kwargs
    )
    got = np.asarray([d.embedding for d in res.data], np.float32)
    assert [d.index for d in res.data] == list(range(5))
    assert res.model == "all-MiniLM-L6-v2" and res.usage.prompt_tokens > 5
    cos = (got * st_encode(reference, SENTENCES[:5])).sum(axis=1)
    assert cos.min() >= 0.999, cos


def test_concurrent_sdk_callers_get_their_own_vectors(
    local_gateway: ServerThread, encoder: TextEncoder
) -> None:
    texts = [f"request number {i} about {SENTENCES[i % 5]}" for i in range(32)]
    expected = encoder.encode(texts)
    client = _client(local_gateway)

    def one(i: int) -> np.ndarray:
        res = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts[i])
        return np.asarray(res.data[0].embedding, np.float32)

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(one, range(32)))
    for i, vec in enumerate(got):
        assert float(vec @ expected[i]) >= 0.9999, i


def test_too_many_tokens_is_a_400_naming_the_input(local_gateway: ServerThread) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        _client(local_gateway).embeddings.create(
            model="all-MiniLM-L6-v2", input=["fine", "word " * 400]
        )
    assert err.value.status_code == 400
    assert "input[1] has 402 tokens; this model takes at most 256" in str(err.value)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"model": "all-MiniLM-L6-v2", "input": []}, "'input' must be a string or a non-empty"),
        ({"model": "all-MiniLM-L6-v2", "input": [""]}, "input[0] is an empty string"),
        ({"model": "all-MiniLM-L6-v2", "input": [[1, 2, 3]]}, "token ids is not supported"),
        ({"model": "all-MiniLM-L6-v2", "input": "x", "dimensions": 64}, "'dimensions' must be 384"),
        ({"model": "all-MiniLM-L6-v2", "input": "x", "encoding_format": "hex"}, "encoding_format"),
    ],
)
def test_bad_embeddings_requests_are_400s(
    local_gateway: ServerThread, body: dict[str, Any], message: str
) -> None:
    status, doc = http("POST", f"{local_gateway.url}/v1/embeddings", body)
    assert status == 400
    error = doc["error"]
    assert message in error["message"] and error["type"] == "invalid_request_error"


def test_readyz_and_metrics_name_the_device(local_gateway: ServerThread) -> None:
    ready = http("GET", f"{local_gateway.url}/readyz")[1]
    minilm = ready["backends"]["minilm"]
    assert minilm["ready"] and minilm["device"] == "cpu"
    assert minilm["providers"] == ["CPUExecutionProvider"]
    _client(local_gateway).embeddings.create(model="all-MiniLM-L6-v2", input="count me")
    text = http("GET", f"{local_gateway.url}/metrics")[1]
    assert 'latentgate_engine_info{device="cpu",engine="onnxruntime"' in text
    assert 'latentgate_batch_size_count{model="all-MiniLM-L6-v2"}' in text
    assert "latentgate_batch_padding_ratio_bucket" in text
