"""A JSON answer read to the connection's close is stored only if it parses.

An upstream that frames its answer by closing the connection (no Content-Length, not chunked:
HTTP/1.0 style, as some proxies and small servers send it) and is cut mid-body looks, at the
HTTP level, like a whole answer. The client of that call gets the cut body (as it would from
the upstream itself), but it must not be stored: before, every later identical call was a hit
on the cut JSON and the openai SDK failed on it until the TTL.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator

import openai
import pytest

from tests.integration.cache.conftest import cache_config
from tests.support.sdk_clients import close_tracked_clients, track  # noqa: F401 (autouse)
from tests.support.servers import ServerThread

ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "a whole answer"},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4},
}


class CloseDelimited:
    """Answers every request with ANSWER framed by the close; the first one cut mid-body."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.calls = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, body = data.split(b"\r\n\r\n", 1)
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                while len(body) < length:
                    body += conn.recv(65536)
                self.calls += 1
                answer = json.dumps(ANSWER).encode()
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Connection: close\r\n\r\n" + (answer[:40] if self.calls == 1 else answer)
                )

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def cutting() -> Iterator[CloseDelimited]:
    server = CloseDelimited()
    yield server
    server.close()


def test_a_json_answer_cut_before_its_close_is_not_stored(
    cutting: CloseDelimited, start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(cache_config(cutting.url, tiers=["memory"]))
    c = track(openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0))
    kw = {"model": "m", "messages": [{"role": "user", "content": "q"}], "temperature": 0}
    with pytest.raises(json.JSONDecodeError):  # the cut body, as the upstream sent it
        c.chat.completions.create(**kw)  # type: ignore[call-overload]
    raw = c.chat.completions.with_raw_response.create(**kw)  # type: ignore[call-overload]
    assert raw.headers["X-Cache"] == "miss"  # before: a hit on the cut body
    assert raw.parse().choices[0].message.content == "a whole answer"
    again = c.chat.completions.with_raw_response.create(**kw)  # type: ignore[call-overload]
    assert (again.headers["X-Cache"], cutting.calls) == ("hit", 2)
