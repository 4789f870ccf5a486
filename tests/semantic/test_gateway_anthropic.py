"""The default Messages route's semantic stage through the real gateway, with the anthropic SDK:
the namespace is everything but the last user turn, as for OpenAI chat. The SDK has no sampling
arguments, so a deterministic call sends temperature 0 through extra_body."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic

from tests.conftest import base_config
from tests.integration.cache.conftest import anthropic_route
from tests.support.sdk_clients import close_tracked_clients, track  # noqa: F401 (autouse)
from tests.support.servers import ServerThread

T0 = {"temperature": 0}


def ask(c: anthropic.Anthropic, text: str, **kw: Any) -> tuple[str, str]:
    raw = c.messages.with_raw_response.create(
        model="claude-test", max_tokens=64, messages=[{"role": "user", "content": text}], **kw
    )
    block = raw.parse().content[0]
    assert block.type == "text"
    return block.text, raw.headers.get("X-Cache", "")


def test_paraphrase_hits_in_its_namespace_only(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    cfg = base_config(upstream.url)
    cfg["routes"].insert(0, anthropic_route(semantic=True))
    gw = start_gateway(cfg)
    alice = track(anthropic.Anthropic(base_url=gw.url, api_key="sk-ant-alice", max_retries=0))
    first, x1 = ask(alice, "How do I reset my password?", extra_body=T0)
    again, x2 = ask(alice, "How can I reset my password?", extra_body=T0)
    assert (x1, x2) == ("miss", "semantic-hit") and again == first
    # another system prompt is another namespace; so is a sampled call, and another key
    assert (
        ask(alice, "How can I reset my password?", extra_body=T0, system="Be terse.")[1] == "miss"
    )
    assert ask(alice, "How can I reset my password?")[1] == "miss"
    bob = track(anthropic.Anthropic(base_url=gw.url, api_key="sk-ant-bob", max_retries=0))
    assert ask(bob, "How can I reset my password?", extra_body=T0)[1] == "miss"
