"""Texts that differ only where the embedder reads [UNK] are never served for one another.

MiniLM's WordPiece vocab has no emoji and no unspaced Thai words: "Can my dog eat 🍎?" and "Can
my dog eat 🍇?" are one input to it (cosine 1.0000), and the learned score put the second over
its bar (0.585) for the first (found by review: 4 wrong answers of 4). The verifiers leave such
a candidate unscored, as they leave an accent-only difference (features.contradicts), so no
static point, learned bar or cosine-only part of one serves it: the request goes upstream."""

from __future__ import annotations

import random
import string
import time
import uuid
from collections.abc import Callable

import numpy as np
import pytest
import redis as redis_lib

from backends.local.artifacts import builtin_dir
from backends.preprocess.cpu import TextPreprocessor
from cache.embedder import Embedder
from cache.semantic.budget_store import field_name
from cache.semantic.features import contradicts, restates, text_info
from cache.semantic.setup import budget_scorer
from cache.semantic.verifier import CosineVerifier, MlpVerifier, Verifier
from gateway.app import build_app
from gateway.config import Settings
from tests.semantic.test_budget_gateway import admin_state, admin_state_context, wait_for
from tests.semantic.test_gateway import ask, client_for, semantic_config
from tests.support.class_upstream import class_answer
from tests.support.servers import RedisServer, ServerThread

# (cached, asked): other questions that the embedder reads as one text
COLLAPSED = [
    ("Can my dog eat 🍎?", "Can my dog eat 🍇?"),  # apple / grapes (toxic to dogs)
    ("ยาแอสไพรินกินได้วันละกี่เม็ด", "ยาพาราเซตามอลกินได้วันละกี่เม็ด"),  # aspirin / paracetamol
    ("วิธีลบบัญชีของฉัน", "วิธีรีเซ็ตรหัสผ่านของฉัน"),  # delete my account / reset my password
    ("Translate ✅ into words", "Translate ⚠️ into words"),
]
# The same [UNK] spans: decided as before, by the words around them
SAME_UNSEEN = [
    ("Can my dog eat 🍎?", "can my dog eat  🍎 ?"),  # restated: served at 1.0
    ("How do I reset my password? 🙏", "How can I reset my password? 🙏"),  # a paraphrase
]


def pair(emb: Embedder, cached: str, asked: str) -> tuple[np.ndarray, np.ndarray]:
    v = emb.embed_sync([asked, cached])
    return v, np.asarray([float(v[0] @ v[1])], dtype=np.float32)


@pytest.mark.parametrize(("cached", "asked"), COLLAPSED)
def test_what_the_embedder_reads_as_unk_is_never_scored(
    verifier: MlpVerifier, embedder: Embedder, cached: str, asked: str
) -> None:
    v, cos = pair(embedder, cached, asked)
    assert float(cos[0]) > 0.9999  # one input to the embedder
    q, c = text_info(asked, embedder.unseen), text_info(cached, embedder.unseen)
    assert q.unseen and c.unseen and q.unseen != c.unseen
    assert contradicts(q, c)
    scorers: list[Verifier] = [verifier, budget_scorer(verifier), CosineVerifier(0.9)]
    for ver in scorers:
        # -1: unscored, which no bar serves, labels or lets join a flight
        assert float(ver.scores(q, v[0], [c], v[1:], cos)[0]) == -1.0, ver.name
        assert ver.choose(q, v[0], [c], v[1:], cos).index == -1, ver.name
    # the learned score alone would have served it: the rule, not the model, refuses it
    raw = verifier.probabilities(verifier.features(q, v[0], [c], v[1:], cos))
    assert float(raw[0]) >= verifier.p_min


@pytest.mark.parametrize(("cached", "asked"), SAME_UNSEEN)
def test_the_same_unk_spans_leave_the_decision_as_it_was(
    verifier: MlpVerifier, embedder: Embedder, cached: str, asked: str
) -> None:
    v, cos = pair(embedder, cached, asked)
    q, c = text_info(asked, embedder.unseen), text_info(cached, embedder.unseen)
    assert q.unseen == c.unseen != ()
    assert not contradicts(q, c)
    before = verifier.scores(text_info(asked), v[0], [text_info(cached)], v[1:], cos)
    assert verifier.scores(q, v[0], [c], v[1:], cos).tolist() == before.tolist()
    assert verifier.choose(q, v[0], [c], v[1:], cos).index == 0
    if restates(q, c):
        assert float(before[0]) == 1.0


def test_unk_spans_are_the_tokenizers_own() -> None:
    """The ASCII shortcut (no tokenising) says exactly what the tokenizer says: a word over its
    100-character limit is [UNK] too, and a deleted control character can join two words."""
    pre = TextPreprocessor.from_file(
        str(builtin_dir("all-MiniLM-L6-v2") / "tokenizer.json"), 256, True
    )
    tok = pre._tok
    unk = tok.token_to_id("[UNK]")

    def tokenized(text: str) -> tuple[str, ...]:
        enc = tok.encode(text)
        return tuple(text[a:b] for i, (a, b) in zip(enc.ids, enc.offsets, strict=True) if i == unk)

    assert pre.unknown.spans("Can my dog eat 🍎?") == ("🍎",)
    assert pre.unknown.spans("วิธีลบบัญชีของฉัน") == ("วิธีลบบัญชีของฉัน",)
    assert pre.unknown.spans("How do I learn Python?") == ()
    long = "x" * 101
    assert pre.unknown.spans(f"What is {long}?") == (long,) == tokenized(long)
    rng = random.Random(5)
    alphabet = string.printable + "\x00\x01\x0b\x0c\x1f\x7f"
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.choice([8, 60, 240])))
        if rng.random() < 0.3:
            text = "a" * rng.randint(96, 104) + text
        assert pre.unknown.spans(text) == tokenized(text), repr(text)


@pytest.fixture
def answers() -> dict[str, str]:
    return {}  # every question its own answer: class_answer("text:" + question)


def own_answer(question: str) -> str:
    return class_answer("text:" + question)


def asks_each_pair(url: str, tag: str) -> None:
    """Each pair under its own tenant (its own namespace): the second question is a miss and
    gets its own answer; the first, asked again, is still an exact hit. And the same emoji
    around a paraphrase is a semantic hit, as before (the stage is up and serving)."""
    for i, (cached, asked) in enumerate(COLLAPSED):
        c = client_for(url, f"sk-{tag}{i}")
        assert ask(c, cached, temperature=0)[1]["x-cache"] == "miss"
        text, h = ask(c, asked, temperature=0)
        assert (h["x-cache"], text) == ("miss", own_answer(asked)), (cached, asked)
        assert ask(c, cached, temperature=0)[1]["x-cache"] == "hit"
    c = client_for(url, f"sk-{tag}-same")
    cached, asked = SAME_UNSEEN[1]
    first, _ = ask(c, cached, temperature=0)
    text, h = ask(c, asked, temperature=0)
    assert (h["x-cache"], text) == ("semantic-hit", first)


def test_the_static_point_sends_an_unk_paraphrase_upstream(
    class_upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(semantic_config(class_upstream.url))
    asks_each_pair(gw.url, "static")


def test_an_open_learned_bar_sends_an_unk_paraphrase_upstream(
    class_upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """The shipped prior opens the bar at the static point's region (the reviewer's set-up)."""
    cfg = semantic_config(class_upstream.url, max_error_rate=0.2, min_labels=50)
    gw = start_gateway(cfg)
    assert admin_state(gw.url)["budget"]["bar"]["open"]
    asks_each_pair(gw.url, "prior")
    assert admin_state(gw.url)["budget"]["bar"]["open"]


def test_a_cosine_only_bar_sends_an_unk_paraphrase_upstream(
    class_upstream: ServerThread, redis_server: RedisServer
) -> None:
    """A bar whose cosine-only part serves any score at cosine >= 0.99: the collapsed pairs
    sit at 1.0000, so only their being unscored keeps them from it."""
    cfg = semantic_config(class_upstream.url, redis_server.url, max_error_rate=0.10, prior=False)
    prefix = f"unk{uuid.uuid4().hex[:8]}:"
    cfg["cache"]["redis"]["key_prefix"] = prefix
    settings = Settings.model_validate(cfg)
    key = f"{prefix}sem:budget2:chat:{admin_state_context(settings)}"
    now = int(time.time())
    r = redis_lib.Redis.from_url(redis_server.url)
    # as tests/semantic/test_budget_opposites.py: the shipped point's region clean, and
    # near-verbatim repeats clean whatever their score
    for (cos, score), n, wrong in (((0.95, 0.55), 300, 0), ((0.98, 0.10), 300, 3)):
        r.hset(key, field_name("l", now, 0, cos, score), n)
        r.hset(key, field_name("w", now, 0, cos, score), wrong)
        r.hset(key, field_name("v", now, 0, cos, score), n)
    gw = ServerThread(lambda: build_app(settings)).start()
    try:
        wait_for(lambda: admin_state(gw.url)["budget"]["bar"]["open"], "the bar opens")
        assert admin_state(gw.url)["budget"]["bar"]["cosine_only"] <= 0.99
        asks_each_pair(gw.url, "cosonly")
    finally:
        r.close()
        gw.stop()
