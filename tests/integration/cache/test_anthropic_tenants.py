"""One Anthropic API key acting in two Workspaces (or for two user profiles) is two tenants.

The anthropic SDK sends `messages.create(workspace_id=...)` as the `anthropic-workspace-id`
header and `user_profile_id=...` as `anthropic-user-profile-id`: the Workspace whose files,
skills and containers the request reads, and the party it is made for. The upstream here answers
from the Workspace's own documents, as the API does for a `file_id`; another Workspace's
request must reach it, never be served the first one's cached answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import pytest
from aiohttp import web

from tests.conftest import base_config
from tests.integration.cache.conftest import anthropic_route
from tests.support.sdk_clients import close_tracked_clients, track  # noqa: F401 (autouse)
from tests.support.servers import ServerThread, running

# what each Workspace's file `file_report` says (another Workspace has no such file)
CALLS = web.AppKey("calls", list)
DOCUMENTS = {"wrkspc_alpha": "alpha's revenue was 10", "wrkspc_beta": "beta's revenue was 99"}


async def _messages(request: web.Request) -> web.Response:
    body = await request.json()
    request.app[CALLS].append(dict(request.headers))
    place = request.headers.get("anthropic-workspace-id", "")
    party = request.headers.get("anthropic-user-profile-id", "")
    if place not in DOCUMENTS:
        error = {"type": "not_found_error", "message": "File not found: file_report"}
        return web.json_response({"type": "error", "error": error}, status=404)
    text = f"{DOCUMENTS[place]} (for {party or 'the organization'})"
    message = {
        "id": "msg_" + place + party,
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 5},
    }
    return web.json_response(message)


def _upstream() -> web.Application:
    app = web.Application()
    app[CALLS] = []
    app.router.add_post("/v1/messages", _messages)
    return app


@pytest.fixture
def upstream() -> Iterator[ServerThread]:
    with running(_upstream) as server:
        yield server


@pytest.fixture
def gw(upstream: ServerThread, start_gateway: Callable[..., ServerThread]) -> ServerThread:
    cfg = base_config(upstream.url)
    cfg["routes"].insert(0, anthropic_route())
    return start_gateway(cfg)


def _ask(url: str, **kw: Any) -> tuple[str, str]:
    """One key, one question about the report; `kw` the Workspace or user profile."""
    c = track(anthropic.Anthropic(base_url=url, api_key="sk-ant-org-key", max_retries=0))
    raw = c.messages.with_raw_response.create(
        model="claude-test",
        max_tokens=64,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "document", "source": {"type": "file", "file_id": "file_report"}},
                    {"type": "text", "text": "What was the revenue?"},
                ],
            }
        ],
        **kw,
    )
    block = raw.parse().content[0]
    assert block.type == "text"
    return block.text, raw.headers.get("X-Cache", "")


def test_another_workspace_is_not_served_the_first_ones_answer(gw: ServerThread) -> None:
    assert _ask(gw.url, workspace_id="wrkspc_alpha") == (
        "alpha's revenue was 10 (for the organization)",
        "miss",
    )
    assert _ask(gw.url, workspace_id="wrkspc_alpha")[1] == "hit"
    # the same key in Workspace beta reads beta's file: the upstream's answer, not alpha's
    assert _ask(gw.url, workspace_id="wrkspc_beta") == (
        "beta's revenue was 99 (for the organization)",
        "miss",
    )
    # a Workspace without the file is the API's 404, not alpha's cached revenue
    with pytest.raises(anthropic.NotFoundError):
        _ask(gw.url, workspace_id="wrkspc_gamma")


def test_another_user_profile_is_another_tenant(gw: ServerThread, upstream: ServerThread) -> None:
    first = _ask(gw.url, workspace_id="wrkspc_alpha", user_profile_id="uprof_ann")
    assert first == ("alpha's revenue was 10 (for uprof_ann)", "miss")
    assert _ask(gw.url, workspace_id="wrkspc_alpha", user_profile_id="uprof_bob") == (
        "alpha's revenue was 10 (for uprof_bob)",
        "miss",
    )
    assert _ask(gw.url, workspace_id="wrkspc_alpha", user_profile_id="uprof_ann") == (
        first[0],
        "hit",
    )
    assert upstream.app is not None and len(upstream.app[CALLS]) == 2
