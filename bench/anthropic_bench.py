"""Anthropic Messages API side by side, in one run: `.venv/bin/python -m bench.anthropic_bench`.

Targets, all answering the same POST /v1/messages body (x-api-key and anthropic-version set, as
the SDK sends them), as one JSON message and as an SSE stream (`"stream": true`):
  direct        the test upstream (tests/support/upstream.py), no gateway
  pass-through  latentgate, the Messages route with its exact cache off (parse, proxy)
  hit           latentgate, the default Messages route (exact cache on, memory): every request
                after the first is an L1 hit (a stream is replayed from the stored events)
wrk (Lua script for the POST body) measures throughput and p50/p95/p99 at 1 and 32 connections.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.cache_bench import LUA_DONE, wrk  # noqa: E402
from tests.conftest import base_config  # noqa: E402
from tests.integration.cache.conftest import anthropic_route  # noqa: E402
from tests.support.servers import GatewayProcess, free_port, wait_port  # noqa: E402

PATH = "/v1/messages"
BODY: dict[str, Any] = {
    "model": "claude-bench",
    "max_tokens": 256,
    "messages": [{"role": "user", "content": "what is the capital of france?"}],
}
HEADERS = {
    "Content-Type": "application/json",
    "x-api-key": "sk-ant-bench",
    "anthropic-version": "2023-06-01",
}
LUA = (
    """
wrk.method = "POST"
wrk.body = [[%s]]
wrk.headers["Content-Type"] = "application/json"
wrk.headers["x-api-key"] = "sk-ant-bench"
wrk.headers["anthropic-version"] = "2023-06-01"
"""
    + LUA_DONE
)


def messages_route(cache: bool) -> dict[str, Any]:
    """The default config's Messages route in memory, exact path only; its cache on or off."""
    route = anthropic_route()
    route["cache"]["exact"]["enabled"] = cache
    return route


@contextmanager
def gateway(upstream: str, cache: bool) -> Iterator[str]:
    cfg = base_config(upstream)
    cfg["routes"].insert(0, messages_route(cache))
    cfg["logging"] = {"level": "warning"}
    gw = GatewayProcess(cfg).start()
    try:
        yield gw.url
    finally:
        gw.stop()


@contextmanager
def upstream_process() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.upstream", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port("127.0.0.1", port, 30)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def post(url: str, body: bytes) -> tuple[int, str, bytes]:
    req = urllib.request.Request(url + PATH, data=body, headers=HEADERS, method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, r.headers.get("X-Cache", ""), r.read()


def upstream_calls(upstream: str) -> int:
    with urllib.request.urlopen(upstream + "/_test/stats", timeout=10) as r:
        return int(json.loads(r.read())["requests"].get(PATH, 0))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--seconds", type=float, default=5.0, help="per wrk run (after 1 s warm-up)")
    args = ap.parse_args()
    rows: list[tuple[str, str, dict[str, float], dict[str, float], int]] = []
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        upstream = stack.enter_context(upstream_process())
        targets = {
            "direct": upstream,
            "pass-through": stack.enter_context(gateway(upstream, cache=False)),
            "hit": stack.enter_context(gateway(upstream, cache=True)),
        }
        for framing, stream in (("json", False), ("sse", True)):
            # one question per framing: the SSE rows replay a stored stream, not a stored JSON
            # message converted (which is equivalent but not byte-identical to the upstream's)
            doc = {**BODY, "stream": stream, "metadata": {"user_id": framing}}
            doc["messages"] = [{"role": "user", "content": f"{framing}: what is the capital?"}]
            body = json.dumps(doc, separators=(",", ":")).encode()
            script = str(Path(tmp) / f"{framing}.lua")
            Path(script).write_text(LUA % body.decode())
            expected = post(upstream, body)[2]
            for name, url in targets.items():
                status, _, got = post(url, body)  # warm: the hit target stores it here
                assert status == 200 and got == expected, f"{name} answered differently"
                if name == "hit":
                    assert post(url, body)[1] == "hit", "the hit target did not answer a hit"
                wrk(url, 1, 1, script, PATH)  # warm-up
                before = upstream_calls(upstream)
                one = wrk(url, 1, args.seconds, script, PATH)
                many = wrk(url, 32, args.seconds, script, PATH)
                rows.append((framing, name, one, many, upstream_calls(upstream) - before))
    print(f"\nPOST {PATH}, {len(json.dumps(BODY))}-byte body, wrk -t1, {args.seconds:g} s per cell")
    print(
        "| framing | target | 1 conn req/s | p50 / p95 / p99 ms | 32 conn req/s "
        "| p50 / p95 / p99 ms | errors | upstream calls |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for framing, name, one, many, calls in rows:
        print(
            f"| {framing} | {name} | {one['rps']:,.0f} | {_pcts(one)} | {many['rps']:,.0f} "
            f"| {_pcts(many)} | {int(one['errors'] + many['errors'])} | {calls} |"
        )
    return 0


def _pcts(r: dict[str, float]) -> str:
    return f"{r['p50_ms']:.2f} / {r['p95_ms']:.2f} / {r['p99_ms']:.2f}"


if __name__ == "__main__":
    sys.exit(main())
