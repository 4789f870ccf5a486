"""A stored Messages API answer streams its citations and server tool input as the API does.

The API streams a cited text block's citations as `citations_delta` events and a server tool's
(web search's) input as `input_json_delta`, as it does a client tool's. A stored message served
as a stream put both whole in the block's `content_block_start` instead: the SDK's final message
was the same, but `messages.stream()` yielded no `citation` and no `input_json` event, and stream
readers that build citations from the deltas (tracing plugins, agent frameworks) lost them all.
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

CITATION = {
    "type": "char_location",
    "cited_text": "The grass is green.",
    "document_index": 0,
    "document_title": "Facts",
    "start_char_index": 0,
    "end_char_index": 19,
    "file_id": None,
}
SEARCH = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search"}
RESULT = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}
USAGE = {"input_tokens": 40, "output_tokens": 12}
MESSAGE = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test"}


def _stream() -> list[bytes]:
    """As the API streams it: the search's input and the text's citation as deltas."""
    start = {**MESSAGE, "content": [], "stop_reason": None, "stop_sequence": None}
    out = [event("message_start", message={**start, "usage": {**USAGE, "output_tokens": 1}})]
    out.append(event("content_block_start", index=0, content_block={**SEARCH, "input": {}}))
    for part in ('{"query": "gra', 'ss colour"}'):
        delta = {"type": "input_json_delta", "partial_json": part}
        out.append(event("content_block_delta", index=0, delta=delta))
    out.append(event("content_block_stop", index=0))
    out.append(event("content_block_start", index=1, content_block=RESULT))
    out.append(event("content_block_stop", index=1))
    block = {"type": "text", "text": "", "citations": []}
    out.append(event("content_block_start", index=2, content_block=block))
    text = {"type": "text_delta", "text": "The grass is green."}
    out.append(event("content_block_delta", index=2, delta=text))
    cited = {"type": "citations_delta", "citation": CITATION}
    out.append(event("content_block_delta", index=2, delta=cited))
    out.append(event("content_block_stop", index=2))
    stop = {"stop_reason": "end_turn", "stop_sequence": None}
    out.append(event("message_delta", delta=stop, usage={"output_tokens": 12}))
    return [*out, event("message_stop")]


def _message() -> dict[str, Any]:
    content = [
        {**SEARCH, "input": {"query": "grass colour"}},
        RESULT,
        {"type": "text", "text": "The grass is green.", "citations": [CITATION]},
    ]
    done = {"stop_reason": "end_turn", "stop_sequence": None, "usage": USAGE}
    return {**MESSAGE, "content": content, **done}


@pytest.fixture
def upstream() -> Iterator[ServerThread]:
    with running(one_route("/v1/messages", json_or_stream(_message, _stream))) as server:
        yield server


KW: dict[str, Any] = {
    "model": "claude-test",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "What colour is grass?"}],
}


def _streamed(url: str) -> tuple[list[Any], dict[str, Any], str]:
    """The SDK's citation and input_json events, its final message, and X-Cache."""
    with anthropic_client(url).messages.stream(**KW) as s:
        seen = [
            (e.type, e.citation if e.type == "citation" else e.partial_json)
            for e in s
            if e.type in ("citation", "input_json")
        ]
        return seen, s.get_final_message().model_dump(), s.response.headers.get("X-Cache", "")


def test_a_stored_message_streams_citations_and_tool_input_as_deltas(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    cfg = base_config(upstream.url)
    cfg["routes"].insert(0, anthropic_route())
    gw = start_gateway(cfg)
    assert (
        anthropic_client(gw.url).messages.with_raw_response.create(**KW).headers["X-Cache"]
        == "miss"
    )
    events, final, x_cache = _streamed(gw.url)
    direct_events, direct_final, _ = _streamed(upstream.url)
    assert x_cache == "hit"
    kinds = [kind for kind, _ in events]
    assert "citation" in kinds and "input_json" in kinds
    assert [(k, v) for k, v in events if k == "citation"] == [
        (k, v) for k, v in direct_events if k == "citation"
    ]
    assert final == direct_final
