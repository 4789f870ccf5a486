"""Namespaces: the same question in another conversation, tenant or sampling setup never hits."""

from __future__ import annotations

import json
from typing import Any

from cache.semantic.namespace import namespace_of
from gateway.protocols.openai import OpenAIAdapter


def ns(body: dict[str, Any], tenant: str = "t1") -> tuple[str, str | None]:
    call = OpenAIAdapter().parse(
        "POST", "/v1/chat/completions", "", "application/json", json.dumps(body).encode()
    )
    assert call is not None
    return namespace_of("chat", call.model, call.context, tenant), call.semantic_text


BASE = {
    "model": "m",
    "temperature": 0,
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "How do I reset my password?"},
    ],
}


def test_only_the_last_user_turn_is_outside_the_namespace() -> None:
    other_q = {
        **BASE,
        "messages": [
            BASE["messages"][0],
            {"role": "user", "content": "How can I change my password?"},
        ],
    }
    a, text_a = ns(BASE)
    b, text_b = ns(other_q)
    assert a == b and text_a != text_b


def test_context_tenant_and_sampling_change_the_namespace() -> None:
    base, _ = ns(BASE)
    earlier = {
        **BASE,
        "messages": [
            {"role": "user", "content": "I use Windows."},
            {"role": "assistant", "content": "OK."},
            *BASE["messages"],
        ],
    }
    system = {
        **BASE,
        "messages": [{"role": "system", "content": "Answer in French."}, BASE["messages"][1]],
    }
    variants = [
        ns(earlier)[0],
        ns(system)[0],
        ns(BASE, tenant="t2")[0],
        ns({**BASE, "temperature": 0.7})[0],
        ns({**BASE, "max_tokens": 5})[0],
        ns({**BASE, "model": "m2"})[0],
        ns({**BASE, "tools": [{"type": "function", "function": {"name": "f"}}]})[0],
    ]
    assert base not in variants
    assert len(set(variants)) == len(variants)


def test_equal_numbers_written_differently_share_a_namespace() -> None:
    assert ns(BASE)[0] == ns({**BASE, "temperature": 0.0})[0]


def test_the_last_turns_speaker_is_in_the_namespace() -> None:
    """A greeting by name asked by alice is another question from bob: only the last turn's text
    is compared, every other field of it (name) belongs to the namespace."""

    def asked_by(name: str | None) -> dict[str, Any]:
        turn: dict[str, Any] = {"role": "user", "content": "Please greet me warmly by my name."}
        if name is not None:
            turn["name"] = name
        return {**BASE, "messages": [BASE["messages"][0], turn]}

    spaces = {ns(asked_by(n))[0] for n in ("alice", "bob", None)}
    assert len(spaces) == 3
    assert ns(asked_by("alice")) == ns(asked_by("alice"))
