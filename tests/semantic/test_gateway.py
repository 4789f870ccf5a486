"""Semantic caching through the real gateway with the real openai SDK and a real upstream."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from cache.semantic.verifier import MlpVerifier
from tests.integration.cache.conftest import ADMIN_TOKEN, cache_config
from tests.support.servers import GatewayProcess, RedisServer, ServerThread


def semantic_config(
    upstream_url: str, redis_url: str | None = None, **semantic: Any
) -> dict[str, Any]:
    cfg = cache_config(upstream_url, redis_url, routes=("chat",))
    for r in cfg["routes"]:
        if r["name"] == "chat":
            r["cache"]["semantic"] = {"enabled": True, **semantic}
    return cfg


def ask(client: openai.OpenAI, text: str, **extra: Any) -> tuple[str, Any]:
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": text}], **extra
    )
    return raw.parse().choices[0].message.content or "", raw.headers


def client_for(url: str, key: str = "sk-alice") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


@pytest.fixture
def gw(upstream: ServerThread, start_gateway: Callable[..., ServerThread]) -> ServerThread:
    return start_gateway(semantic_config(upstream.url))


def test_paraphrase_is_a_semantic_hit_with_the_cached_answer(gw: ServerThread) -> None:
    c = client_for(gw.url)
    first, h1 = ask(c, "How do I reset my password?", temperature=0)
    assert h1["x-cache"] == "miss"
    again, h2 = ask(c, "How can I reset my password?", temperature=0)
    assert h2["x-cache"] == "semantic-hit" and again == first
    assert float(h2["x-cache-similarity"]) > 0.9
    assert "semantic;dur=" in h2["server-timing"]


def test_refusals_other_tenants_and_sampled_calls_miss(gw: ServerThread) -> None:
    c = client_for(gw.url)
    ask(c, "What is 2+3?", temperature=0)
    assert ask(c, "What is 2+4?", temperature=0)[1]["x-cache"] == "miss"
    ask(c, "Is the Tabaci a tributary of the Leurda?", temperature=0)
    assert ask(c, "Is the Leurda a tributary of the Tabaci?", temperature=0)[1]["x-cache"] == "miss"
    ask(c, "How do I reset my password?", temperature=0)
    assert (
        ask(client_for(gw.url, "sk-bob"), "How can I reset my password?", temperature=0)[1][
            "x-cache"
        ]
        == "miss"
    )
    # a sampled call is not answered from the cache at all, and says why
    sampled = ask(c, "How can I reset my password?", temperature=0.8)[1]
    assert (sampled["x-cache"], sampled["x-cache-bypass-reason"]) == ("bypass", "sampled")


def test_purge_removes_vectors(gw: ServerThread) -> None:
    c = client_for(gw.url)
    ask(c, "How do I reset my password?", temperature=0)
    status, doc = admin_post(gw.url, "/admin/cache/purge", {"all": True})
    assert status == 200 and doc["purged"]["semantic"] == 1
    assert ask(c, "How can I reset my password?", temperature=0)[1]["x-cache"] == "miss"


def test_an_answer_a_purge_kept_out_is_not_indexed_either(
    upstream: ServerThread, gw: ServerThread
) -> None:
    """A miss upstream while everything is purged: its answer goes to its client but is not
    stored (it may be what the purge removed), and its question is not indexed to an answer
    that is not there (a second purge finds no vector to remove)."""
    c = client_for(gw.url)

    def purge() -> dict[str, Any]:
        status, doc = admin_post(gw.url, "/admin/cache/purge", {"all": True})
        assert status == 200
        purged: dict[str, Any] = doc["purged"]
        return purged

    slow = threading.Thread(
        target=lambda: ask(
            c, "How do I reset my password?", temperature=0, extra_headers={"X-Test-Delay": "2"}
        )
    )
    slow.start()
    for _ in range(200):  # until the miss is upstream (it answers 2 s later)
        with urllib.request.urlopen(f"{upstream.url}/_test/stats", timeout=10) as r:
            if json.loads(r.read())["in_flight"]:
                break
        time.sleep(0.02)
    purge()
    slow.join()
    assert purge()["semantic"] == 0
    assert ask(c, "How can I reset my password?", temperature=0)[1]["x-cache"] == "miss"


def embeds_so_far(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    prefix = 'latentgate_semantic_stage_seconds_count{step="embed"} '
    found = [ln for ln in text.splitlines() if ln.startswith(prefix)]
    return float(found[0].split()[-1]) if found else 0.0  # no series before the first embed


def test_metrics_name_where_the_embedder_and_index_run(gw: ServerThread) -> None:
    with urllib.request.urlopen(f"{gw.url}/metrics", timeout=10) as r:
        text = r.read().decode()
    series = [ln for ln in text.splitlines() if ln.startswith("latentgate_semantic_device_info{")]
    # One series once the embedder has loaded (no stale "pending" one beside it).
    assert series == ['latentgate_semantic_device_info{embedder="cpu",index="cpu"} 1.0']


def test_metrics_count_the_index_bytes(gw: ServerThread) -> None:
    def index_bytes() -> float:
        with urllib.request.urlopen(f"{gw.url}/metrics", timeout=10) as r:
            lines = r.read().decode().splitlines()
        (line,) = [ln for ln in lines if ln.startswith("latentgate_semantic_index_bytes ")]
        return float(line.split()[1])

    before = index_bytes()
    ask(
        client_for(gw.url),
        f"What is the boiling point of water {uuid.uuid4().hex[:6]}?",
        temperature=0,
    )
    deadline = time.monotonic() + 5
    while index_bytes() == before and time.monotonic() < deadline:
        time.sleep(0.05)  # the entry is stored after the answer is sent
    assert index_bytes() > before


def test_a_miss_embeds_its_question_once(gw: ServerThread) -> None:
    """The lookup's vector is the one stored after the upstream answers: a miss costs one run of
    the embedder, not two."""
    c = client_for(gw.url)
    before = embeds_so_far(gw.url)
    assert ask(c, "How do I reset my password?", temperature=0)[1]["x-cache"] == "miss"
    assert embeds_so_far(gw.url) - before == 1
    _, h = ask(c, "How can I reset my password?", temperature=0)
    assert h["x-cache"] == "semantic-hit" and embeds_so_far(gw.url) - before == 2
    # A call that skips the lookup (no-cache) still stores: it embeds for the store.
    ask(c, "Which river flows through Vienna?", temperature=0,
        extra_headers={"Cache-Control": "no-cache"})  # fmt: skip
    assert embeds_so_far(gw.url) - before == 3


def admin_post(
    url: str, path: str, body: dict[str, Any], coding: str | None = None
) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"}
    if coding is not None:
        headers["Content-Encoding"] = coding
        data = gzip.compress(data) if coding == "gzip" else data
    req = urllib.request.Request(f"{url}{path}", data=data, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_wrong_hit_feedback_tightens_that_entry(gw: ServerThread) -> None:
    c = client_for(gw.url)
    ask(c, "How do I reset my password?", temperature=0)
    _, h = ask(c, "How can I reset my password?", temperature=0)
    assert h["x-cache"] == "semantic-hit"
    body = {"entry": h["x-cache-entry"], "score": float(h["x-cache-score"])}
    # a coding the server did not decode is refused, not read as JSON; gzip is read decoded
    status, doc = admin_post(gw.url, "/admin/cache/semantic/wrong-hit", body, "x-custom")
    assert status == 415 and "x-custom" in doc["error"]["message"]
    assert admin_post(gw.url, "/admin/cache/semantic/wrong-hit", body, "gzip")[0] == 200
    assert ask(c, "How can I reset my password?", temperature=0)[1]["x-cache"] == "miss"
    assert admin_post(gw.url, "/admin/cache/semantic/wrong-hit", {"entry": "nope"})[0] == 404
    assert admin_post(gw.url, "/admin/cache/semantic/wrong-hit", {"score": 1})[0] == 400
    assert admin_post(gw.url, "/admin/cache/semantic/wrong-hit", {"entry": "\ud800"})[0] == 400


@pytest.mark.slow
def test_two_processes_share_through_redis(
    upstream: ServerThread, redis_server: RedisServer
) -> None:
    cfg = semantic_config(upstream.url, redis_server.url)
    cfg["cache"]["redis"]["key_prefix"] = f"sem{uuid.uuid4().hex[:8]}:"
    a, b = GatewayProcess(cfg).start(), GatewayProcess(cfg).start()
    try:
        text = ask(client_for(a.url), "How do I reset my password?", temperature=0)[0]
        # The route serves the operating point calibrated into the verifier's artifact, and
        # the start-up log says which.
        meta = MlpVerifier.load().meta
        point = f"semantic route chat: verifier mlp, cosine >= {meta['floor']:g}, score >= "
        assert point + f"{meta['p_min']:g}" in a.log()
        deadline = time.monotonic() + 1.0
        while True:
            got, h = ask(client_for(b.url), "How can I reset my password?", temperature=0)
            if h["x-cache"] == "semantic-hit" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert h["x-cache"] == "semantic-hit" and got == text
        # A wrong-hit report through A stops that reuse in B too (the bar is replicated).
        body = {"entry": h["x-cache-entry"], "score": float(h["x-cache-score"])}
        assert admin_post(a.url, "/admin/cache/semantic/wrong-hit", body)[0] == 200
        deadline = time.monotonic() + 1.0
        while True:
            h = ask(client_for(b.url), "How can I reset my password?", temperature=0)[1]
            if h["x-cache"] == "miss" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert h["x-cache"] == "miss"
    finally:
        a.stop()
        b.stop()


def test_cross_encoder_verifier_serves_through_the_gateway(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread], ce_artifact: Path
) -> None:
    # The plumbing end to end (ONNX build at start-up, scoring off the loop, headers); the
    # untrained test artifact's bar is set to accept, so the hit proves the path, not a judgement.
    cfg = semantic_config(upstream.url, verifier="cross-encoder", threshold=0.8, min_score=0.0)
    cfg["cache"] = {"semantic": {"cross_encoder_artifact": str(ce_artifact)}}
    gw = start_gateway(cfg)
    c = client_for(gw.url)
    first = ask(c, "How do I reset my password?", temperature=0)[0]
    again, h = ask(c, "How can I reset my password?", temperature=0)
    assert h["x-cache"] == "semantic-hit" and again == first
    assert 0.0 <= float(h["x-cache-score"]) <= 1.0


def test_check_config_names_a_missing_cross_encoder(upstream: ServerThread, tmp_path: Path) -> None:
    cfg = semantic_config(upstream.url, verifier="cross-encoder")
    cfg["cache"] = {"semantic": {"cross_encoder_artifact": str(tmp_path / "none.npz")}}
    path = tmp_path / "lg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 1
    assert "verifier 'cross-encoder' needs its artifact" in out.stderr
    assert "bench.train_cross_encoder" in out.stderr


def test_a_paraphrase_that_may_not_take_the_entry_leaves_it_for_everyone_else(
    gw: ServerThread,
) -> None:
    """A lookup the entry cannot answer for this request (its max-age, its framing) is a miss
    for that request only: the index entry stays, for every client and sidecar."""
    c = client_for(gw.url)
    first, h1 = ask(c, "How do I reset my password?", temperature=0)
    assert h1["x-cache"] == "miss"
    time.sleep(1.1)  # the entry is a second old: too old for max-age=0
    strict = c.with_options(
        default_headers={"Cache-Control": "max-age=0, only-if-cached"}
    ).chat.completions.with_raw_response
    with pytest.raises(openai.APIStatusError) as err:
        strict.create(
            model="m",
            messages=[{"role": "user", "content": "How can I reset my password?"}],
            temperature=0,
        )
    assert err.value.status_code == 504
    # that 504 was this request's alone: the paraphrase without the directives is still a hit
    text, h2 = ask(c, "How can I reset my password?", temperature=0)
    assert h2["x-cache"] == "semantic-hit" and text == first


def test_a_wrong_hit_report_without_a_score_stops_that_entry_answering_paraphrases(
    gw: ServerThread,
) -> None:
    c = client_for(gw.url)
    ask(c, "How do I reset my password?", temperature=0)
    _, h = ask(c, "How can I reset my password?", temperature=0)
    assert h["x-cache"] == "semantic-hit"
    for bad in (float("nan"), 1.5, -0.1, "high", True, [0.5], 10**400):  # (no float holds 10**400)
        body = {"entry": h["x-cache-entry"], "score": bad}
        status = admin_post(gw.url, "/admin/cache/semantic/wrong-hit", body)[0]
        assert status == 400, (bad, status)
    assert ask(c, "How can I reset my password?", temperature=0)[1]["x-cache"] == "semantic-hit"
    assert (
        admin_post(gw.url, "/admin/cache/semantic/wrong-hit", {"entry": h["x-cache-entry"]})[0]
        == 200
    )
    assert ask(c, "How can I reset my password?", temperature=0)[1]["x-cache"] == "miss"
    # the exact request still hits: only paraphrases were wrong
    assert ask(c, "How do I reset my password?", temperature=0)[1]["x-cache"] == "hit"


def test_a_wrong_hit_score_may_come_as_the_header_text(gw: ServerThread) -> None:
    c = client_for(gw.url)
    ask(c, "How do I reset my password?", temperature=0)
    _, h = ask(c, "How can I reset my password?", temperature=0)
    body = {"entry": h["x-cache-entry"], "score": h["x-cache-score"]}  # a string
    assert admin_post(gw.url, "/admin/cache/semantic/wrong-hit", body)[0] == 200
    assert ask(c, "How can I reset my password?", temperature=0)[1]["x-cache"] == "miss"


def test_a_lone_surrogate_skips_the_semantic_stage_quietly(
    gw: ServerThread, caplog: pytest.LogCaptureFixture
) -> None:
    """JSON lets "\\ud800" through; no tokeniser takes it. The call is answered (exact cache
    only) and says why the semantic stage passed it by, with no error logged per request."""
    body = (
        b'{"model":"m","temperature":0,"messages":'
        b'[{"role":"user","content":"\\ud800 how do I reset my password"}]}'
    )
    req = urllib.request.Request(
        gw.url + "/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": "Bearer sk-alice"},
    )
    for expected in ("miss", "hit"):
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200
            assert r.headers["X-Cache"] == expected
            if expected == "miss":
                assert r.headers["X-Cache-Semantic-Skip"] == "not_unicode"
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [], [r.getMessage() for r in errors]
