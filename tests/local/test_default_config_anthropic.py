"""`make run`'s config, unchanged, serves the Anthropic SDK: the Messages route caches exact
repeats per API key, plain and streamed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from gateway.app import build_app
from gateway.config import load_settings
from tests.local.conftest import wait_ready
from tests.support.sdk_clients import close_tracked_clients, track  # noqa: F401 (autouse)
from tests.support.servers import ROOT, ServerThread
from tests.support.upstream import build_upstream


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[ServerThread, ServerThread]]:
    upstream = ServerThread(build_upstream).start()
    settings = load_settings(
        ROOT / "config/latentgate.yaml",
        # The OS picks the gRPC port: 8001 may be taken on a shared machine.
        environ={"LATENTGATE_UPSTREAM": upstream.url, "LATENTGATE_GRPC_PORT": "0"},
    )
    gateway = ServerThread(lambda: build_app(settings)).start()
    wait_ready(gateway.url)
    yield upstream, gateway
    gateway.stop()
    upstream.stop()


def test_the_sdk_gets_the_direct_answer_then_a_hit(
    servers: tuple[ServerThread, ServerThread],
) -> None:
    upstream, gateway = servers
    kw: dict[str, Any] = {
        "model": "claude-test",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "default config"}],
    }
    direct = track(anthropic.Anthropic(base_url=upstream.url, api_key="k1", max_retries=0))
    via = track(anthropic.Anthropic(base_url=gateway.url, api_key="k1", max_retries=0))
    expected = direct.messages.create(**kw).model_dump()
    headers = []
    for _ in range(2):
        raw = via.messages.with_raw_response.create(**kw)
        assert raw.parse().model_dump() == expected
        headers.append(raw.headers["X-Cache"])
    with via.messages.stream(**kw) as s:
        assert s.get_final_message().model_dump() == expected
        headers.append(s.response.headers["X-Cache"])
    other = track(anthropic.Anthropic(base_url=gateway.url, api_key="k2", max_retries=0))
    headers.append(other.messages.with_raw_response.create(**kw).headers["X-Cache"])
    assert headers == ["miss", "hit", "hit", "miss"]
