"""The real `python -m gateway serve` process: graceful drain on SIGTERM, readiness while draining,
workers sharing one port (SO_REUSEPORT), a unix listener beside TCP, and env interpolation."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import base_config
from tests.support.servers import GatewayProcess, ServerThread

pytestmark = pytest.mark.slow
CHAT = {"model": "m", "messages": [{"role": "user", "content": "one two three four five"}]}


async def _upstream_in_flight(s: aiohttp.ClientSession, upstream: ServerThread) -> int:
    async with s.get(upstream.url + "/_test/stats") as r:
        return int((await r.json())["in_flight"])


async def _upstream_calls(upstream: ServerThread) -> int:
    async with aiohttp.ClientSession() as s, s.get(upstream.url + "/_test/stats") as r:
        return int((await r.json())["requests"].get("/v1/chat/completions", 0))


async def _raw_get(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str
) -> tuple[int, bytes]:
    writer.write(f"GET {path} HTTP/1.1\r\nHost: gw\r\n\r\n".encode())
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return int(head[9:12]), await reader.readexactly(length)


async def test_sigterm_drains_in_flight_requests_and_streams(
    upstream: ServerThread, procs: list[GatewayProcess]
) -> None:
    gw = GatewayProcess(base_config(upstream.url, limits={"shutdown_grace_s": 15})).start()
    procs.append(gw)
    assert gw.proc is not None
    # A keep-alive connection opened before SIGTERM: it can still ask /readyz while draining.
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    assert (await _raw_get(reader, writer, "/readyz"))[0] == 200

    async with aiohttp.ClientSession() as s:

        async def slow() -> tuple[int, dict[str, object]]:
            async with s.post(
                gw.url + "/v1/chat/completions", json=CHAT, headers={"X-Test-Delay": "1.5"}
            ) as r:
                # finished during the drain: its keep-alive connection is not reused
                assert r.headers.get("Connection", "").lower() == "close"
                return r.status, await r.json()

        async def stream() -> list[bytes]:
            async with s.post(
                gw.url + "/v1/chat/completions",
                json={**CHAT, "stream": True},
                headers={"X-Test-Event-Delay": "0.25"},
            ) as r:
                assert r.status == 200
                return [line async for line in r.content if line.strip()]

        slow_task, stream_task = asyncio.create_task(slow()), asyncio.create_task(stream())
        deadline = time.monotonic() + 10
        while await _upstream_in_flight(s, upstream) < 2:
            assert time.monotonic() < deadline, "requests never reached the upstream"
            await asyncio.sleep(0.02)
        sent = time.monotonic()
        gw.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.3)

        status, body = await _raw_get(reader, writer, "/readyz")
        assert status == 503
        assert json.loads(body)["draining"] is True
        # The listener stays open while draining: a new connection is answered, not refused.
        new_reader, new_writer = await asyncio.open_connection("127.0.0.1", gw.port)
        status, body = await _raw_get(new_reader, new_writer, "/readyz")
        assert status == 503 and json.loads(body)["ready"] is False
        new_writer.close()
        await new_writer.wait_closed()
        async with (
            aiohttp.ClientSession() as fresh,
            fresh.post(gw.url + "/v1/chat/completions", json=CHAT) as r,
        ):
            # New model traffic is turned away (in-flight requests still finish).
            assert r.status == 503 and r.headers["Retry-After"] == "1"
            assert r.headers["Connection"].lower() == "close"
            assert (await r.json())["error"]["type"] == "unavailable"
        # ... and counted: a rollout's 503s show in the error ratio, under the route
        async with aiohttp.ClientSession() as fresh, fresh.get(gw.url + "/metrics") as r:
            metrics = await r.text()
        turned = [
            line
            for line in metrics.splitlines()
            if line.startswith("latentgate_requests_total{") and 'status="503"' in line
        ]
        assert len(turned) == 1 and 'route="chat"' in turned[0], turned
        assert float(turned[0].rsplit(" ", 1)[1]) == 1.0

        (code, answer), events = await asyncio.gather(slow_task, stream_task)
    writer.close()
    await writer.wait_closed()
    assert code == 200 and answer["object"] == "chat.completion"
    assert events[-1] == b"data: [DONE]\n" and len(events) == 9  # role, 6 words, finish, [DONE]
    rc = await asyncio.to_thread(gw.proc.wait, 15)
    assert rc == 0, gw.log()
    assert time.monotonic() - sent < 15


async def test_a_cached_answer_finished_during_the_drain_closes_its_connection(
    upstream: ServerThread, procs: list[GatewayProcess]
) -> None:
    """A single-flight waiter's answer (written as one block, gateway/hit_response.py) that
    goes out during the drain says Connection: close, as the leader's does: the client's next
    request must not meet a 503 on the old connection."""
    from tests.integration.cache.conftest import cache_config

    cfg = cache_config(upstream.url, tiers=["memory"])
    cfg.setdefault("limits", {})["shutdown_grace_s"] = 15
    gw = GatewayProcess(cfg).start()
    procs.append(gw)
    assert gw.proc is not None
    async with aiohttp.ClientSession() as s:

        async def ask() -> tuple[int, str, str]:
            async with s.post(
                gw.url + "/v1/chat/completions",
                json={**CHAT, "temperature": 0},  # deterministic: the two share one flight
                headers={"X-Test-Delay": "1.5"},
            ) as r:
                await r.read()
                return r.status, r.headers.get("X-Cache", ""), r.headers.get("Connection", "")

        leader = asyncio.create_task(ask())
        deadline = time.monotonic() + 10
        while await _upstream_in_flight(s, upstream) < 1:
            assert time.monotonic() < deadline, "the leader never reached the upstream"
            await asyncio.sleep(0.02)
        waiter = asyncio.create_task(ask())
        await asyncio.sleep(0.3)  # the waiter has joined the leader's flight
        gw.proc.send_signal(signal.SIGTERM)
        results = await asyncio.gather(leader, waiter)
    assert [(st, conn.lower()) for st, _, conn in results] == [(200, "close"), (200, "close")]
    assert await _upstream_calls(upstream) == 1  # the waiter's answer was the leader's
    assert await asyncio.to_thread(gw.proc.wait, 15) == 0


async def test_two_workers_share_one_port(
    upstream: ServerThread, procs: list[GatewayProcess]
) -> None:
    gw = GatewayProcess(base_config(upstream.url), workers=2).start()
    procs.append(gw)
    assert gw.proc is not None
    deadline = time.monotonic() + 20
    while len(children := _children(gw.proc.pid)) < 2 or len(_listening(gw.port, children)) < 2:
        assert time.monotonic() < deadline, gw.log()
        await asyncio.sleep(0.1)
    # SO_REUSEPORT: each worker has its own listening socket on the same port.
    owners = _listening(gw.port, children)
    assert set(owners.values()) == set(children)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        for _ in range(20):
            async with s.post(gw.url + "/v1/chat/completions", json=CHAT) as r:
                assert r.status == 200
        # a scrape lands on either worker and holds both: every series labelled by its worker,
        # their sum the gateway's count (one worker's alone used to jump from scrape to scrape)
        for _ in range(4):
            async with s.get(gw.url + "/metrics") as r:
                families = {f.name: f for f in text_string_to_metric_families(await r.text())}
            served = [
                x for x in families["latentgate_requests"].samples if x.name.endswith("_total")
            ]
            assert {x.labels["worker"] for x in served} == {"0", "1"}
            assert sum(x.value for x in served) == 20
            workers = {x.labels["state"]: x.value for x in families["latentgate_workers"].samples}
            assert workers == {"answered": 2, "missing": 0}
    rc = await asyncio.to_thread(gw.stop, signal.SIGTERM, 20)
    assert rc == 0, gw.log()
    assert not any(_is_running(pid) for pid in children)


async def test_uds_flag_adds_unix_listener(
    upstream: ServerThread, procs: list[GatewayProcess], tmp_sock_dir: str
) -> None:
    sock = os.path.join(tmp_sock_dir, "gw.sock")
    gw = GatewayProcess(base_config(upstream.url), extra_args=["--uds", sock]).start()
    procs.append(gw)
    deadline = time.monotonic() + 20
    while not os.path.exists(sock):  # noqa: ASYNC240 - a cheap stat in a poll loop
        assert time.monotonic() < deadline, gw.log()
        await asyncio.sleep(0.05)
    unix = aiohttp.UnixConnector(path=sock)
    async with (
        aiohttp.ClientSession(connector=unix) as s,
        s.post("http://gw/v1/chat/completions", json=CHAT) as r,
    ):
        assert r.status == 200
        assert (await r.json())["choices"][0]["message"]["content"].startswith("echo(up)")
    async with aiohttp.ClientSession() as s, s.get(gw.url + "/healthz") as r:
        assert r.status == 200  # TCP still serves beside the unix socket
    assert await asyncio.to_thread(gw.stop, signal.SIGTERM, 20) == 0
    assert not os.path.exists(sock)  # noqa: ASYNC240


async def test_env_interpolation_in_a_served_config(
    upstream: ServerThread, procs: list[GatewayProcess]
) -> None:
    cfg = base_config("${LG_TEST_UPSTREAM:-http://127.0.0.1:9}")
    cfg["limits"] = {"max_body_bytes": "${LG_TEST_MAX_BODY:-1000}"}
    gw = GatewayProcess(cfg, env={"LG_TEST_UPSTREAM": upstream.url}).start()
    procs.append(gw)
    async with aiohttp.ClientSession() as s:
        async with s.post(gw.url + "/v1/chat/completions", json=CHAT) as r:
            assert r.status == 200  # the variable named the real upstream
        async with s.post(gw.url + "/anything", data=b"x" * 1001) as r:
            assert r.status == 413  # the default applied to the unset variable


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


def _is_running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _listening(port: int, pids: list[int]) -> dict[int, int]:
    """Listening socket inode → owning pid, for sockets on 127.0.0.1:port."""
    inodes = set()
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            cols = line.split()
            if cols[1].endswith(f":{port:04X}") and cols[3] == "0A":
                inodes.add(int(cols[9]))
    owners: dict[int, int] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except FileNotFoundError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and int(link[8:-1]) in inodes:
                owners[int(link[8:-1])] = pid
    return owners


async def test_served_process_routes_model_admin_probe_and_expect_requests_as_the_router_does(
    upstream: ServerThread, procs: list[GatewayProcess]
) -> None:
    """The server hands model traffic straight to the pipeline (gateway/dispatch.py); what the
    router used to decide must not change: probes and the admin API, a non-GET probe path going
    to the routes, and `Expect: 100-continue` answered before the body is sent."""
    gw = GatewayProcess(base_config(upstream.url, admin={"token": "t0ken-0123456789abcdef"}))
    procs.append(gw.start())
    async with aiohttp.ClientSession() as s:
        async with s.post(gw.url + "/v1/chat/completions", json=CHAT) as r:
            assert r.status == 200
            assert "total;dur=" in r.headers["Server-Timing"]
        async with s.get(gw.url + "/healthz") as r:
            assert r.status == 200
        async with s.post(gw.url + "/healthz", data=b"{}") as r:
            # no probe for POST: the default route passed it upstream (the pipeline's header)
            assert "Server-Timing" in r.headers
        async with s.get(gw.url + "/admin/config") as r:
            assert r.status == 401  # the admin API, behind its token
        # the gateway's own v2 server calls, registered before the catch-all, stay its own
        async with s.get(gw.url + "/v2") as r:
            assert r.status == 200 and (await r.json())["name"] == "latentgate"
        async with s.get(gw.url + "/v2/health/live") as r:
            assert r.status == 200 and (await r.json()) == {"live": True}
        async with s.get(gw.url + "/metrics") as r:
            text = await r.text()
        assert 'latentgate_requests_total{backend="upstream",route="chat",status="200"} 1.0' in text
        # the request_target middleware's work: dot segments resolved, undecodable headers refused
        async with s.post(gw.url + "/v1/x/../chat/completions", json=CHAT) as r:
            assert r.status == 200
            assert (await r.json())["object"] == "chat.completion"
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(b"GET /v1/models HTTP/1.1\r\nHost: gw\r\nX-Bad: \xff\xfe\r\n\r\n")
    await writer.drain()
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 400")
    writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    body = json.dumps(CHAT).encode()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    await writer.drain()
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 100 Continue")
    writer.write(body)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    writer.close()
    # and the shortcut was really taken (it once turned itself off and the answers were the same)
    assert "takes aiohttp's router" not in gw.log()


@pytest.mark.parametrize("mode", ["common", "json"])
async def test_access_log_is_opt_in_in_common_or_json_format(
    upstream: ServerThread, procs: list[GatewayProcess], mode: str
) -> None:
    cfg = base_config(upstream.url, logging={"access_log": mode})
    gw = GatewayProcess(cfg).start()
    procs.append(gw)
    async with aiohttp.ClientSession() as s:
        async with s.post(gw.url + "/v1/chat/completions?x=1", json=CHAT) as r:
            assert r.status == 200
        async with s.get(gw.url + "/healthz") as r:
            assert r.status == 200
    assert await asyncio.to_thread(gw.stop, signal.SIGTERM, 20) == 0
    lines = [
        line.split("latentgate.access ", 1)[1].split("] ", 1)[1]
        for line in gw.log().splitlines()
        if " latentgate.access " in line and "/readyz" not in line  # start() polls /readyz
    ]
    assert len(lines) == 2, gw.log()
    if mode == "json":
        first = json.loads(lines[0])
        assert first["method"] == "POST" and first["path"] == "/v1/chat/completions"
        assert first["status"] == 200 and first["query"] == "x=1" and first["bytes"] > 0
        assert first["duration_ms"] > 0 and json.loads(lines[1])["path"] == "/healthz"
    else:
        assert lines[0].startswith("127.0.0.1 - - [")
        assert '"POST /v1/chat/completions?x=1 HTTP/1.1" 200 ' in lines[0]
        assert '"GET /healthz HTTP/1.1" 200 ' in lines[1]


async def test_no_access_log_by_default(
    upstream: ServerThread, procs: list[GatewayProcess]
) -> None:
    gw = GatewayProcess(base_config(upstream.url)).start()
    procs.append(gw)
    async with aiohttp.ClientSession() as s, s.get(gw.url + "/healthz") as r:
        assert r.status == 200
    assert await asyncio.to_thread(gw.stop, signal.SIGTERM, 20) == 0
    assert " latentgate.access " not in gw.log()
