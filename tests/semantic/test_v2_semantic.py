"""Semantic hits on the Open Inference (v2) path: one question per request.

A v2 route with `cache.semantic.field` takes that BYTES input as the question. A batch of
several strings is not one question: a paraphrase of its first string was once served the
whole stored batch (another question's answer for the second string, and a two-element output
for a one-element request)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.cache.conftest import cache_config
from tests.support.servers import ServerThread


def v2_config(upstream_url: str) -> dict[str, Any]:
    cfg = cache_config(upstream_url, routes=("v2",))
    for r in cfg["routes"]:
        if r["name"] == "v2":
            r["cache"]["semantic"] = {"enabled": True, "field": "TEXT"}
    return cfg


def infer(url: str, texts: list[str], key: str = "sk-a") -> tuple[dict[str, Any], Any]:
    body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]}
    req = urllib.request.Request(
        f"{url}/v2/models/m/infer",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read()), r.headers


@pytest.fixture
def gw(upstream: ServerThread, start_gateway: Callable[..., ServerThread]) -> ServerThread:
    return start_gateway(v2_config(upstream.url))


def test_a_paraphrased_single_question_is_a_semantic_hit(gw: ServerThread) -> None:
    first, h1 = infer(gw.url, ["How do I reset my password?"])
    assert h1["x-cache"] == "miss"
    again, h2 = infer(gw.url, ["How can I reset my password?"])
    assert h2["x-cache"] == "semantic-hit"
    assert again["outputs"] == first["outputs"]


def test_a_batch_whose_first_question_is_a_paraphrase_is_not_served_the_stored_batch(
    gw: ServerThread,
) -> None:
    _, h1 = infer(gw.url, ["How do I reset my password?", "What is the capital of France?"])
    assert h1["x-cache"] == "miss"
    b, h2 = infer(gw.url, ["How can I reset my password?", "Who wrote Hamlet?"])
    assert h2["x-cache"] == "miss"
    assert "FRANCE" not in json.dumps(b) and "HAMLET" in json.dumps(b)


def test_a_single_question_is_not_served_a_stored_batch(gw: ServerThread) -> None:
    infer(gw.url, ["How do I reset my password?", "What is the capital of France?"])
    b, h2 = infer(gw.url, ["How can I reset my password?"])
    assert h2["x-cache"] == "miss" and b["outputs"][0]["shape"] == [1]


def test_another_tenant_is_not_served_the_paraphrase(gw: ServerThread) -> None:
    infer(gw.url, ["How do I reset my password?"], key="sk-a")
    assert infer(gw.url, ["How can I reset my password?"], key="sk-b")[1]["x-cache"] == "miss"
    assert infer(gw.url, ["How can I reset my password?"], key="sk-a")[1]["x-cache"] == (
        "semantic-hit"
    )


def test_two_inputs_of_one_name_are_refused_not_served_another_question(gw: ServerThread) -> None:
    """Two inputs named like the semantic field: the question would be one of them and the
    namespace blind to both, so a request whose other TEXT asked something else was once served
    the stored outputs of a different question. Inputs are named tensors: a 400 with a JSON
    error, and nothing reaches the upstream or the cache."""

    def two(first: str, second: str) -> Any:
        body = {
            "inputs": [
                {"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": [first]},
                {"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": [second]},
            ]
        }
        req = urllib.request.Request(
            f"{gw.url}/v2/models/m/infer",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": "Bearer sk-a"},
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=30)
        with err.value as e:  # (closes its socket)
            return e.code, e.headers["Content-Type"], json.loads(e.read())

    code, ctype, doc = two("What is the capital of France?", "How do I reset my password?")
    assert code == 400 and ctype.startswith("application/json")
    assert "'TEXT' appears more than once" in doc["error"]
    assert two("Who wrote Hamlet?", "How can I reset my password?")[0] == 400
