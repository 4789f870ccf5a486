"""Fixtures of the integration tests that start the served gateway as its own process."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from tests.support.servers import GatewayProcess


@pytest.fixture
def procs() -> Iterator[list[GatewayProcess]]:
    """The GatewayProcess-es a test starts (append them): killed when it ends, whatever it left."""
    started: list[GatewayProcess] = []
    yield started
    for p in started:
        p.stop(signal.SIGKILL, timeout=5)
