"""Route policy: deterministic-only by default, min_chars, and namespaces from real OpenAI calls."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, cast

from cache.semantic.features import text_info
from cache.semantic.route import SemanticRoute
from cache.semantic.stage import SemanticStage
from cache.semantic.verifier import MlpVerifier
from cache.settings import SemanticPolicy
from gateway.protocols.base import Call
from gateway.protocols.openai import OpenAIAdapter


def chat(text: str, **extra: Any) -> Call:
    body = {"model": "m", "messages": [{"role": "user", "content": text}], **extra}
    call = OpenAIAdapter().parse(
        "POST", "/v1/chat/completions", "", "application/json", json.dumps(body).encode()
    )
    assert call is not None
    return call


async def test_deterministic_only_by_default(stage: SemanticStage, verifier: MlpVerifier) -> None:
    route = SemanticRoute(stage, "chat", SemanticPolicy(enabled=True), verifier)
    assert not await route.remember(chat("How do I reset my password?"), "t", "k0")  # temp 1.0
    assert await route.remember(chat("How do I reset my password?", temperature=0), "t", "k1")
    assert await route.lookup(chat("How can I reset my password?", temperature=0.7), "t") is None
    hit = await route.lookup(chat("How can I reset my password?", temperature=0), "t")
    assert hit is not None and hit.exact_key == "k1"
    # A seed makes a sampled call repeatable, so it is cacheable too (in its own namespace).
    assert route.applies(chat("How can I reset my password?", temperature=0.7, seed=3))


async def test_policy_can_allow_sampled_calls(stage: SemanticStage, verifier: MlpVerifier) -> None:
    route = SemanticRoute(
        stage, "chat", SemanticPolicy(enabled=True, only_deterministic=False), verifier
    )
    assert route.applies(chat("How do I reset my password?", temperature=0.9))


async def test_short_texts_and_other_tenants_miss(
    stage: SemanticStage, verifier: MlpVerifier
) -> None:
    route = SemanticRoute(stage, "chat", SemanticPolicy(enabled=True, min_chars=8), verifier)
    assert not route.applies(chat("hi", temperature=0))
    await route.remember(chat("How do I reset my password?", temperature=0), "tenant-a", "k")
    assert (
        await route.lookup(chat("How can I reset my password?", temperature=0), "tenant-b") is None
    )


async def test_routes_skip_the_stage_while_its_embedder_loads(
    stage: SemanticStage, verifier: MlpVerifier
) -> None:
    route = SemanticRoute(stage, "chat", SemanticPolicy(enabled=True), verifier)
    call = chat("How do I reset my password?", temperature=0)
    stage.ready = False  # what the setup sets until its background load is done
    assert not route.applies(call) and route.skip_reason(call) == "loading"
    assert await route.embed(call) is None and not await route.remember(call, "t", "k")
    assert await route.lookup(call, "t") is None
    stage.ready = True
    assert await route.remember(call, "t", "k")


def test_skip_reasons_say_why_the_stage_did_not_look() -> None:
    def call(text: str | None, deterministic: bool = True) -> Any:
        return SimpleNamespace(
            model="m", deterministic=deterministic, semantic_text=text, context=None
        )

    # a stage whose embedder is in
    loaded = cast(Any, SimpleNamespace(ready=True, text_info=text_info))
    route = SemanticRoute(loaded, "chat", SemanticPolicy(enabled=True), cast(Any, None))
    assert route.skip_reason(call("How do I reset my password?")) is None
    assert route.skip_reason(call(None)) == "no_text"
    assert route.skip_reason(call("hi")) == "too_short"
    assert route.skip_reason(call("word " * 100_000)) == "too_long"  # decided on length alone
    assert route.skip_reason(call("How do I reset my password?", False)) == "sampled"
    off = SemanticRoute(loaded, "chat", SemanticPolicy(), cast(Any, None))
    assert off.skip_reason(call("How do I reset my password?")) == "disabled"
    assert not route.applies(call("word " * 100_000))
