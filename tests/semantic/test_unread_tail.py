"""Two long prompts that share what the embedder reads (its 256-token window) and differ after
it are one input to it: cosine 1.0, whatever they ask at the end (a shared context, then the
question, is how retrieval prompts are written). The part past the window is an unseen span
(backends/preprocess/unknown.py), so a candidate whose tail differs is never scored: no
verifier, static cosine point or cosine-only bar serves it, and the request goes upstream."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from backends.local.artifacts import builtin_dir
from backends.preprocess.cpu import TextPreprocessor
from backends.preprocess.unknown import TAIL
from cache.embedder import Embedder
from cache.semantic.features import text_info
from cache.semantic.setup import budget_scorer
from cache.semantic.verifier import CosineVerifier, MlpVerifier, Verifier
from tests.semantic.test_gateway import ask, client_for, semantic_config
from tests.semantic.test_unk_spans import answers, own_answer  # noqa: F401 (a fixture)
from tests.support.servers import ServerThread

CONTEXT = (
    "Context: The city council met on Tuesday to discuss the new budget for the coming year. "
    "Members argued about funding for parks, roads, schools and the public library, and "
    "several residents spoke. "
) * 9
PARKS = CONTEXT + "Question: How much money was allocated to the parks?"
LIBRARY = CONTEXT + "Question: Who spoke against the library funding?"


@pytest.fixture(scope="module")
def pre() -> TextPreprocessor:
    return TextPreprocessor.from_file(
        str(builtin_dir("all-MiniLM-L6-v2") / "tokenizer.json"), 256, True
    )


def test_the_unread_tail_is_a_span_and_short_texts_have_none(pre: TextPreprocessor) -> None:
    assert len(PARKS) < 2048  # under the semantic stage's max_chars: it is looked up
    tail = pre.unknown.spans(PARKS)
    assert len(tail) == 1 and tail[0].startswith(TAIL)
    assert tail[0].endswith("allocated to the parks?")
    assert pre.unknown.spans(LIBRARY) != tail
    assert pre.unknown.spans("How do I learn Python?") == ()
    assert pre.unknown.spans("word " * 254) == ()  # 254 tokens: the whole text is read
    assert pre.unknown.spans("word " * 255)[-1].startswith(TAIL)
    # the shortcut for short ASCII texts says what tokenising says
    for n in (200, 250, 253, 254, 255, 260):
        text = "a," * (n // 2)
        enc = pre._tok.encode(text)
        assert bool(pre.unknown.spans(text)) == bool(enc.overflowing), n


def test_a_tail_the_embedder_never_read_is_never_scored(
    verifier: MlpVerifier, embedder: Embedder
) -> None:
    v = embedder.embed_sync([LIBRARY, PARKS])
    cos = np.asarray([float(v[0] @ v[1])], dtype=np.float32)
    assert float(cos[0]) > 0.9999  # one input to the embedder
    q, c = text_info(LIBRARY, embedder.unseen), text_info(PARKS, embedder.unseen)
    blind_q, blind_c = text_info(LIBRARY), text_info(PARKS)
    assert CosineVerifier(0.9).choose(blind_q, v[0], [blind_c], v[1:], cos).index == 0
    scorers: list[Verifier] = [verifier, budget_scorer(verifier), CosineVerifier(0.9)]
    for s in scorers:
        assert s.choose(q, v[0], [c], v[1:], cos).index == -1, s.name
        assert float(s.scores(q, v[0], [c], v[1:], cos)[0]) < 0, s.name
    # the same long text is the same input: decided as before
    same = text_info(PARKS, embedder.unseen)
    assert CosineVerifier(0.9).choose(same, v[1], [c], v[1:], np.ones(1, np.float32)).index == 0


def test_a_cosine_point_sends_a_long_prompt_with_another_question_upstream(
    class_upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(semantic_config(class_upstream.url, verifier="off"))
    c = client_for(gw.url, "sk-tail")
    assert ask(c, PARKS, temperature=0)[1]["x-cache"] == "miss"
    text, h = ask(c, LIBRARY, temperature=0)
    assert (h["x-cache"], text) == ("miss", own_answer(LIBRARY))
    # a short paraphrase is still a semantic hit on this route (the stage is serving)
    first, _ = ask(c, "How do I reset my password?", temperature=0)
    text, h = ask(c, "How can I reset my password?", temperature=0)
    assert (h["x-cache"], text) == ("semantic-hit", first)
