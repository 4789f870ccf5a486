"""A repeat of the same question whose exact entry cannot serve this request (older than the
client's max-age; a stream asked for as one body) is no label: its own entry was the unserved
candidate, the miss stored its fresh answer under that key, and the label compared the answer
with itself ("agree", every time). Three such repeats opened the bar with no paraphrase seen."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.semantic.test_budget_gateway import BUDGET, PARA, Q, admin_state
from tests.semantic.test_gateway import ask, client_for, semantic_config
from tests.support.servers import ServerThread


@pytest.fixture
def answers() -> dict[str, str]:
    """The paraphrase has another answer: serving it the stored one would show."""
    return {Q: "Open Settings, then Security, then Reset.", PARA: "Contact support."}


def test_a_repeat_of_the_same_question_is_no_label(
    class_upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(semantic_config(class_upstream.url, **BUDGET))
    for t in range(3):
        c = client_for(gw.url, f"sk-t{t}")
        assert ask(c, Q, temperature=0)[1]["x-cache"] == "miss"
        time.sleep(2.1)
        fresh = {"Cache-Control": "max-age=1"}
        assert ask(c, Q, temperature=0, extra_headers=fresh)[1]["x-cache"] == "miss"
    time.sleep(1.0)
    state = admin_state(gw.url)["budget"]
    c = client_for(gw.url, "sk-t0")
    text, h = ask(c, PARA, temperature=0)
    assert state["labels"] == 0, "labels from a question compared with itself"
    assert h["x-cache"] != "semantic-hit" and text == "Contact support."


def test_a_stream_then_the_same_question_as_one_body_is_no_label(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    """The everyday trigger: a streamed answer (no usage chunk) cannot serve a one-body request
    with the same key; its semantic candidate is its own key, and the label is self-agreement."""
    gw = start_gateway(semantic_config(upstream.url, **BUDGET))
    for t in range(3):
        c = client_for(gw.url, f"sk-t{t}")
        chunks = c.chat.completions.create(
            model="m", temperature=0, stream=True, messages=[{"role": "user", "content": Q}]
        )
        assert "".join(x.choices[0].delta.content or "" for x in chunks if x.choices)
        assert ask(c, Q, temperature=0)[1]["x-cache"] == "miss"
    time.sleep(1.0)
    state = admin_state(gw.url)["budget"]
    assert state["labels"] == 0, "labels from a question compared with itself"
    assert not state["bar"]["open"]
