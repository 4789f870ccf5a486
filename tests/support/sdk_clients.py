"""SDK clients hold keep-alive sockets: a test module that makes them tracks each one, and the
autouse fixture closes them after every test (an unclosed socket's ResourceWarning fails)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

import anthropic
import openai
import pytest

C = TypeVar("C")
_OPEN: list[Any] = []


def track(client: C) -> C:
    _OPEN.append(client)
    return client


@pytest.fixture(autouse=True)
def close_tracked_clients() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def openai_client(url: str) -> openai.OpenAI:
    """The OpenAI SDK on a gateway (or upstream) at `url`, tracked: closed after the test (an SDK
    client's pool can sit in a reference cycle, and its socket would be collected, unclosed,
    during some later test)."""
    return track(openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0))


def anthropic_client(url: str) -> anthropic.Anthropic:
    """The Anthropic SDK on a gateway (or upstream) at `url`, tracked like openai_client."""
    return track(anthropic.Anthropic(base_url=url, api_key="sk-ant-test", max_retries=0))
