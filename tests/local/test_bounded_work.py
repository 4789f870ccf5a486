"""One request's work is bounded: oversized texts are refused or cut by characters before any
tokenising, item counts are capped per route, and /healthz keeps answering meanwhile."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from typing import Any

import openai
import pytest

from backends.local.text_encoder import TextEncoder
from tests.local.conftest import http
from tests.support.servers import ServerThread


def _post(url: str, doc: Any) -> tuple[int, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(doc).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_a_huge_input_is_refused_by_its_length_alone(local_gateway: ServerThread) -> None:
    client = openai.OpenAI(base_url=f"{local_gateway.url}/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model="all-MiniLM-L6-v2", input="lorem ipsum " * 300_000)
    assert "3600000 characters; this model takes at most 256 tokens" in str(err.value)


def test_truncating_models_only_tokenise_a_bounded_prefix(encoder: TextEncoder) -> None:
    # the session encoder truncates: a 3.6 MB text costs what its first characters cost
    long = "lorem ipsum " * 300_000
    tokens = encoder.tokenize([long])[0]
    assert len(tokens.ids) == encoder.max_tokens
    assert encoder.preprocessor.max_chars < len(long)


def test_item_caps_are_a_413_before_any_work(local_gateway: ServerThread) -> None:
    status, doc = _post(
        f"{local_gateway.url}/v1/embeddings",
        {"model": "all-MiniLM-L6-v2", "input": ["x"] * 2049},
    )
    assert status == 413 and "at most 2048" in doc["error"]["message"]
    texts = ["a short text"] * 10_000
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]}
    status, doc = _post(f"{local_gateway.url}/v2/models/all-MiniLM-L6-v2/infer", body)
    assert status == 413 and "at most 2048" in doc["error"]


def test_healthz_answers_while_a_large_batch_is_in_flight(local_gateway: ServerThread) -> None:
    texts = [f"sentence number {i} about the weather in a small town" for i in range(600)]
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]}
    result: dict[str, Any] = {}

    def big() -> None:
        result["answer"] = _post(f"{local_gateway.url}/v2/models/all-MiniLM-L6-v2/infer", body)

    worker = threading.Thread(target=big)
    worker.start()
    answered_during = 0
    while worker.is_alive():
        status, _ = http("GET", f"{local_gateway.url}/healthz")
        assert status == 200
        if worker.is_alive():
            answered_during += 1
    worker.join()
    status, doc = result["answer"]
    assert status == 200 and doc["outputs"][0]["shape"] == [600, 384]
    assert answered_during > 0  # the event loop kept serving while 600 texts were embedded


class _Counting:
    """The real tokenizer, counting the texts it is given."""

    def __init__(self, tok: Any) -> None:
        self._tok = tok
        self.texts = 0

    def encode_batch(self, texts: list[str]) -> Any:
        self.texts += len(texts)
        return self._tok.encode_batch(texts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tok, name)


def test_a_refused_input_stops_the_tokenising_of_the_rest(encoder: TextEncoder) -> None:
    """Without truncation, 2,048 texts each over the window are refused at the first: a slice
    of them is tokenised, not all (before: every one, 7 s of CPU for the same 400)."""
    from tokenizers import Tokenizer

    from backends.errors import BadInput
    from backends.preprocess.cpu import TextPreprocessor

    tok = Tokenizer.from_str(encoder.preprocessor._tok.to_str())
    pre = TextPreprocessor(tok, encoder.max_tokens, truncate=False)
    counting = _Counting(pre._tok)
    pre._tok = counting  # type: ignore[assignment]
    fine = "a short question about the weather"
    too_long = "word " * 400  # 2,000 characters, over 256 tokens
    with pytest.raises(BadInput, match=r"input\[1\] has \d+ tokens"):
        pre.tokenize([fine, too_long] + [too_long] * 2046)
    assert counting.texts <= 64
    # a request with nothing over the window is tokenised whole, in order
    assert [len(t.ids) for t in pre.tokenize([fine] * 200)] == [
        len(pre.tokenize([fine])[0].ids)
    ] * 200


@pytest.mark.parametrize("truncate", [True, False])
def test_no_texts_are_no_tokens(encoder: TextEncoder, truncate: bool) -> None:
    """Tokenising a slice at a time must not make an empty list an error: with truncation the
    slice was the whole list, a step of 0 (range() raised ValueError where [] came back)."""
    from tokenizers import Tokenizer

    from backends.preprocess.cpu import TextPreprocessor

    tok = Tokenizer.from_str(encoder.preprocessor._tok.to_str())
    assert TextPreprocessor(tok, encoder.max_tokens, truncate=truncate).tokenize([]) == []
