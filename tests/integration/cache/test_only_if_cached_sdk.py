"""only-if-cached with nothing stored is one 504 the SDKs do not retry.

The openai and anthropic SDKs retry a 504 twice by default, with backoff, unless the answer
says `x-should-retry: false`. Asking again finds the same nothing: before, each such call was
three requests and a few seconds of backoff before the client saw its 504.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import openai
import pytest

from tests.integration.cache.conftest import anthropic_route, cache_config
from tests.support.sdk_clients import close_tracked_clients, track  # noqa: F401 (autouse)
from tests.support.servers import ServerThread

ONLY = {"Cache-Control": "only-if-cached"}


def _counting(sent: list[str]) -> dict[str, Any]:
    def hook(request: Any) -> None:
        sent.append(str(request.url))

    return {"event_hooks": {"request": [hook]}}


def test_neither_sdk_retries_a_504_for_nothing_stored(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    cfg = cache_config(upstream.url, tiers=["memory"], routes=("chat",))
    cfg["routes"].insert(0, anthropic_route())
    gw = start_gateway(cfg)
    sent: list[str] = []
    oa = openai.OpenAI(
        base_url=gw.url + "/v1",
        api_key="sk-test",
        http_client=openai.DefaultHttpxClient(**_counting(sent)),
    )
    with pytest.raises(openai.APIStatusError) as err:
        track(oa).chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "nothing stored"}],
            temperature=0,
            extra_headers=ONLY,
        )
    assert err.value.status_code == 504
    assert len(sent) == 1  # before: 3 (two retries)
    an = anthropic.Anthropic(
        base_url=gw.url,
        api_key="sk-ant-test",
        http_client=anthropic.DefaultHttpxClient(**_counting(sent)),
    )
    with pytest.raises(anthropic.APIStatusError) as aerr:
        track(an).messages.create(
            model="claude-test",
            max_tokens=16,
            messages=[{"role": "user", "content": "nothing stored"}],
            extra_headers=ONLY,
        )
    assert aerr.value.status_code == 504
    assert len(sent) == 2
