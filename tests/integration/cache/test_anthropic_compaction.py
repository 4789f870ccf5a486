"""A stored Messages API stream with a compaction block is that message served as one body.

With the context-management beta the API may compact a long conversation: the answer opens with
a `compaction` block whose summary and opaque state the client must send back verbatim, and its
`context_management` says what was applied. The stream sends the block's content as a
`compaction_delta` and `context_management` on `message_delta`. A stored stream served to a
non-streaming client built the block with neither (the delta type was skipped) and dropped
`context_management`: the client's next turn sent an empty summary back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.conftest import base_config
from tests.integration.cache.conftest import anthropic_route
from tests.support.replies import json_or_stream
from tests.support.sdk_clients import (  # noqa: F401 (autouse)
    anthropic_client,
    close_tracked_clients,
)
from tests.support.servers import ServerThread, one_route, running
from tests.support.upstream_anthropic import event

BETA = "compact-2026-01-12"
SUMMARY = {"content": "The user asked about grass; it is green.", "encrypted_content": "ENC=="}
APPLIED = {"applied_edits": []}
USAGE = {"input_tokens": 900, "output_tokens": 20}
MESSAGE = {"id": "msg_c", "type": "message", "role": "assistant", "model": "claude-test"}


def _stream() -> list[bytes]:
    start = {**MESSAGE, "content": [], "stop_reason": None, "stop_sequence": None}
    out = [event("message_start", message={**start, "usage": {**USAGE, "output_tokens": 1}})]
    block = {"type": "compaction", "content": None, "encrypted_content": None}
    out.append(event("content_block_start", index=0, content_block=block))
    delta = {"type": "compaction_delta", **SUMMARY}
    out.append(event("content_block_delta", index=0, delta=delta))
    out.append(event("content_block_stop", index=0))
    out.append(event("content_block_start", index=1, content_block={"type": "text", "text": ""}))
    text = {"type": "text_delta", "text": "Still green."}
    out.append(event("content_block_delta", index=1, delta=text))
    out.append(event("content_block_stop", index=1))
    stop = {"stop_reason": "end_turn", "stop_sequence": None}
    done = {"delta": stop, "usage": {"output_tokens": 20}, "context_management": APPLIED}
    out.append(event("message_delta", **done))
    return [*out, event("message_stop")]


def _message() -> dict[str, Any]:
    content = [{"type": "compaction", **SUMMARY}, {"type": "text", "text": "Still green."}]
    done = {"stop_reason": "end_turn", "stop_sequence": None, "usage": USAGE}
    return {**MESSAGE, "content": content, **done, "context_management": APPLIED}


@pytest.fixture
def upstream() -> Iterator[ServerThread]:
    with running(one_route("/v1/messages", json_or_stream(_message, _stream))) as server:
        yield server


KW: dict[str, Any] = {
    "model": "claude-test",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "And now?"}],
    "betas": [BETA],
}


def test_a_stored_compacting_stream_is_the_upstreams_message(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    cfg = base_config(upstream.url)
    cfg["routes"].insert(0, anthropic_route())
    gw = start_gateway(cfg)
    with anthropic_client(gw.url).beta.messages.stream(**KW) as s:
        assert s.response.headers["X-Cache"] == "miss"
        s.until_done()
    raw = anthropic_client(gw.url).beta.messages.with_raw_response.create(**KW)
    assert raw.headers["X-Cache"] == "hit"
    served = raw.parse().model_dump()
    direct = anthropic_client(upstream.url).beta.messages.create(**KW).model_dump()
    assert served["content"][0]["content"] == SUMMARY["content"]
    assert served == direct
