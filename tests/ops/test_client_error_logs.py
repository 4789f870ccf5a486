"""A request the HTTP parser refuses is the client's mistake: it gets its JSON 400, and the
gateway's log gets one line for it, not an ERROR with a traceback per refused request (which an
operator's log alerting reads as the gateway failing, and any client could flood)."""

from __future__ import annotations

import socket
from collections.abc import Callable

from tests.conftest import base_config
from tests.support.servers import GatewayProcess, ServerThread

MALFORMED = [
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Note: a\x01b\r\n"
    b"Content-Length: 2\r\n\r\n{}",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
    b"Content-Length: 2\r\n\r\n{}",
    b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
]


def _send(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(raw)
        out = b""
        while chunk := s.recv(65536):  # the gateway closes after an error
            out += chunk
        return out


def test_a_malformed_request_is_one_log_line_not_an_error_with_a_traceback(
    upstream: ServerThread, gateway_process: Callable[..., GatewayProcess]
) -> None:
    gw = gateway_process(base_config(upstream.url))
    for raw in MALFORMED:
        head, _, body = _send(gw.port, raw).partition(b"\r\n\r\n")
        assert b" 400 " in head.split(b"\r\n", 1)[0] and body.startswith(b'{"error"'), head
    log = gw.log()
    assert "Traceback" not in log and " ERROR " not in log, log[-2000:]
    assert log.count("refused a malformed request from 127.0.0.1") == len(MALFORMED), log[-2000:]
