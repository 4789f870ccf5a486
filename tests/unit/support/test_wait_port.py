"""The test harness's port wait: a TCP self-connect is not a listening server."""

from __future__ import annotations

import socket

import pytest

from tests.support.servers import free_port, self_connected, wait_port


def test_a_self_connect_is_not_a_server() -> None:
    port = free_port()
    with socket.socket() as c:
        c.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        c.bind(("127.0.0.1", port))
        c.connect(("127.0.0.1", port))  # nothing listens: the kernel joins the socket to itself
        assert self_connected(c)


def test_wait_port_returns_for_a_listener_and_times_out_without_one() -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as c:
            assert not self_connected(c)
        wait_port("127.0.0.1", port, 2)
    with pytest.raises(TimeoutError):
        wait_port("127.0.0.1", free_port(), 0.3)
