"""Exact-hit path side by side, in one run: `.venv/bin/python -m bench.cache_bench`.

Targets, all answering the same POST /v1/chat/completions body from a cache (or directly):
  upstream      the aiohttp test model server, direct (what a miss costs at least)
  nginx-fixed   nginx returning a fixed JSON body (the fastest possible HTTP answer here)
  nginx-cache   nginx proxy_cache with proxy_cache_methods POST and the body in the key
  floor         a bare aiohttp + uvloop handler doing a dict lookup (the Python floor for a hit)
  gw-l1-wN      latentgate, exact cache in memory (L1), N workers
  gw-l2-wN      latentgate, Redis only (tiers: [redis], so every hit is a Redis GET), N workers
wrk (Lua script for the POST body) measures throughput and p50/p95/p99 at 1 and 32 connections;
bench/openloop.c (compiled here; wrk2 is not packaged) measures latency at a steady 2,000 req/s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
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

from bench.peers import require_tools  # noqa: E402
from tests.conftest import base_config  # noqa: E402
from tests.support.servers import GatewayProcess, RedisServer, free_port, wait_port  # noqa: E402

BODY = {
    "model": "m",
    "messages": [{"role": "user", "content": "what is the capital of france?"}],
    "temperature": 0,
}
BODY_BYTES = json.dumps(BODY, separators=(",", ":")).encode()
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}
FIXED = (
    '{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"m","choices":'
    '[{"index":0,"message":{"role":"assistant","content":"echo(up): what is the capital of '
    'france?"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":7,'
    '"total_tokens":10}}'
)
PATH = "/v1/chat/completions"

# wrk's report as one JSON line that `wrk()` reads (other benches append it to their scripts;
# `%%` because every script is %-formatted with its body).
LUA_DONE = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'RESULT {"requests": %%d, "duration_us": %%d, "errors": %%d, "non2xx": %%d, ' ..
    '"p50_us": %%d, "p95_us": %%d, "p99_us": %%d}\\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(95), latency:percentile(99)))
end
"""
LUA = (
    """
wrk.method = "POST"
wrk.body = [[%s]]
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-bench"
"""
    + LUA_DONE
)

NGINX = """
worker_processes 1;
user root;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  keepalive_requests 10000000;
  proxy_cache_path {dir}/cache levels=1:2 keys_zone=lg:10m max_size=100m inactive=60m
                   use_temp_path=off;
  upstream up {{ server 127.0.0.1:{up_port}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{fixed_port};
    location / {{ default_type application/json; return 200 '{fixed}'; }}
  }}
  server {{
    listen 127.0.0.1:{cache_port};
    client_body_buffer_size 64k;
    location / {{
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_cache lg;
      proxy_cache_methods POST;
      proxy_cache_key "$request_method|$request_uri|$request_body";
      proxy_cache_valid 200 10m;
      proxy_cache_lock on;
      add_header X-Cache-Status $upstream_cache_status;
    }}
  }}
}}
"""


def post(url: str) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url + PATH, data=BODY_BYTES, headers=HEADERS, method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, dict(r.headers), r.read()


@contextmanager
def process(args: list[str], port: int, **kw: Any) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
    try:
        wait_port("127.0.0.1", port, 30)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def gateway(
    upstream: str, tiers: list[str], workers: int, redis: str | None
) -> Iterator[tuple[str, int]]:
    cfg = base_config(upstream)
    cfg["routes"][0]["cache"] = {"exact": {"enabled": True, "ttl": 3600, "tiers": tiers}}
    cfg["logging"] = {"level": "warning"}
    if redis is not None:
        cfg["cache"] = {"redis": {"url": redis, "key_prefix": f"bench{workers}{tiers[0]}:"}}
    gw = GatewayProcess(cfg, workers=workers).start()
    try:
        assert gw.proc is not None
        yield gw.url, gw.proc.pid
    finally:
        gw.stop()


def wrk(url: str, conns: int, seconds: float, script: str, path: str = PATH) -> dict[str, float]:
    """One wrk run (1 thread) of a script ending in LUA_DONE: throughput, latency, errors."""
    out = subprocess.run(
        ["wrk", "-t1", f"-c{conns}", f"-d{max(1, round(seconds))}s", "-s", script, url + path],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    m = re.search(r"RESULT (\{.*\})", out)
    if m is None:
        raise RuntimeError("wrk printed no result:\n" + out)
    r = json.loads(m.group(1))
    return {
        "rps": r["requests"] / (r["duration_us"] / 1e6),
        "requests": r["requests"],
        "p50_ms": r["p50_us"] / 1000,
        "p95_ms": r["p95_us"] / 1000,
        "p99_ms": r["p99_us"] / 1000,
        "errors": r["errors"] + r["non2xx"],
    }


def openloop(exe: str, url: str, rate: int, seconds: float, req_file: str) -> dict[str, float]:
    port = url.rsplit(":", 1)[1]
    out = subprocess.run(
        [exe, "127.0.0.1", port, str(rate), str(seconds), "32", req_file],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    r = json.loads(out)
    return {
        "rate": r["rate"],
        "p50_ms": r["p50_us"] / 1000,
        "p95_ms": r["p95_us"] / 1000,
        "p99_ms": r["p99_us"] / 1000,
        "max_ms": r["max_us"] / 1000,
        "errors": r["errors"] + r["sent"] - r["done"],
        "gen_cpu_pct": 100 * r["cpu_s"] / r["elapsed_s"],
    }


def upstream_calls(upstream: str) -> int:
    with urllib.request.urlopen(upstream + "/_test/stats", timeout=10) as r:
        return int(json.loads(r.read())["requests"].get(PATH, 0))


def check_hit(name: str, url: str) -> None:
    """The target answers correctly, and a cache target answers from its cache (each worker of a
    multi-worker gateway has its own L1, so a few tries may land on a cold one first)."""
    marks = []
    for _ in range(10):
        status, headers, body = post(url)
        if status != 200 or json.loads(body)["choices"][0]["message"]["content"] is None:
            raise RuntimeError(f"{name}: bad answer")
        marks.append(headers.get("X-Cache") or headers.get("X-Cache-Status"))
    if name.startswith(("gw", "nginx-cache")) and not {"hit", "HIT"} & set(marks):
        raise RuntimeError(f"{name}: no cache hit in 10 requests ({marks})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0, help="per wrk run")
    ap.add_argument("--steady-seconds", type=float, default=8.0)
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--only", help="comma-separated target names")
    args = ap.parse_args()
    require_tools("wrk", "nginx")
    tmp = Path(tempfile.mkdtemp(prefix="lg-bench-"))
    script = tmp / "post.lua"
    script.write_text(LUA % BODY_BYTES.decode())
    exe = str(tmp / "openloop")
    subprocess.run(["gcc", "-O2", "-o", exe, str(ROOT / "bench" / "openloop.c")], check=True)
    req_file = tmp / "req.http"
    head = f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(BODY_BYTES)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in HEADERS.items()) + "\r\n"
    req_file.write_bytes(head.encode() + BODY_BYTES)
    py = sys.executable
    results: dict[str, dict[str, Any]] = {}
    steady_targets = {"floor", "nginx-cache", "gw-l1-w1", "gw-l2-w1"}
    with ExitStack() as stack:
        up_port, fixed_port, cache_port, floor_port = (free_port() for _ in range(4))
        up_proc = stack.enter_context(
            process([py, "-m", "tests.support.upstream", "--port", str(up_port)], up_port, cwd=ROOT)
        )
        upstream = f"http://127.0.0.1:{up_port}"
        (tmp / "nginx.conf").write_text(
            NGINX.format(
                dir=tmp, up_port=up_port, fixed_port=fixed_port, cache_port=cache_port, fixed=FIXED
            )
        )
        nginx = stack.enter_context(process(["nginx", "-c", str(tmp / "nginx.conf")], cache_port))
        floor = stack.enter_context(
            process([py, str(ROOT / "bench" / "dict_floor.py"), str(floor_port), FIXED], floor_port)
        )
        redis = RedisServer().start()
        stack.callback(redis.stop)
        targets: dict[str, Any] = {
            "upstream": lambda: _const(upstream, up_proc.pid),
            "nginx-fixed": lambda: _const(f"http://127.0.0.1:{fixed_port}", nginx.pid),
            "nginx-cache": lambda: _const(f"http://127.0.0.1:{cache_port}", nginx.pid),
            "floor": lambda: _const(f"http://127.0.0.1:{floor_port}", floor.pid),
            "gw-l1-w1": lambda: gateway(upstream, ["memory"], 1, None),
            "gw-l1-w2": lambda: gateway(upstream, ["memory"], 2, None),
            "gw-l2-w1": lambda: gateway(upstream, ["redis"], 1, redis.url),
            "gw-l2-w2": lambda: gateway(upstream, ["redis"], 2, redis.url),
        }
        only = set(args.only.split(",")) if args.only else set(targets)
        for name, make in targets.items():
            if name not in only:
                continue
            with make() as (url, pid):
                check_hit(name, url)
                wrk(url, 8, 1, str(script))  # warm-up: connections and pools
                before = upstream_calls(upstream)
                row: dict[str, Any] = {}
                for conns in (1, 32):
                    cpu0 = cpu_seconds(pid)
                    row[f"c{conns}"] = r = wrk(url, conns, args.seconds, str(script))
                    # server CPU per request: steadier than req/s on a shared, noisy machine
                    r["cpu_us"] = 1e6 * (cpu_seconds(pid) - cpu0) / max(1, r["requests"])
                if name in steady_targets:
                    row["steady"] = openloop(
                        exe, url, args.rate, args.steady_seconds, str(req_file)
                    )
                # a cache target that had to call the upstream was not measuring hits only
                row["upstream_calls"] = upstream_calls(upstream) - before
                results[name] = row
                print(f"{name:12s} " + json.dumps(row), flush=True)
    report(results, args.rate)
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "cache_bench.json").write_text(json.dumps(results, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


@contextmanager
def _const(url: str, pid: int) -> Iterator[tuple[str, int]]:
    yield url, pid


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and all its descendants (workers), from /proc."""
    total = 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                total += cpu_seconds(int(child))
    except (OSError, IndexError):
        pass
    return total


def report(results: dict[str, dict[str, Any]], rate: int) -> None:
    print(
        "\ntarget        | 1 conn req/s  p50   p95   p99 (ms) | 32 conn req/s  p50   p95   p99 (ms)"
        f" cpu us/req | steady {rate}/s p50   p95   p99 (ms)"
    )
    for name, row in results.items():
        c1, c32 = row["c1"], row["c32"]
        line = (
            f"{name:13s} | {c1['rps']:10.0f} {c1['p50_ms']:5.2f} {c1['p95_ms']:5.2f} "
            f"{c1['p99_ms']:5.2f}     | {c32['rps']:11.0f} {c32['p50_ms']:5.2f} "
            f"{c32['p95_ms']:5.2f} {c32['p99_ms']:5.2f} {c32['cpu_us']:10.0f} |"
        )
        if "steady" in row:
            s = row["steady"]
            line += (
                f" {s['rate']:10.0f} {s['p50_ms']:5.2f} {s['p95_ms']:5.2f} {s['p99_ms']:5.2f}"
                f" (errors {s['errors']}, generator cpu {s['gen_cpu_pct']:.0f}%)"
            )
        if not name.startswith("upstream"):
            line += f" upstream calls: {row['upstream_calls']}"
        print(line)
    if "floor" in results and "gw-l1-w1" in results:
        ratio = results["gw-l1-w1"]["c32"]["rps"] / results["floor"]["c32"]["rps"]
        print(f"\nL1 hit, 1 worker, 32 conns: {ratio:.0%} of the Python floor (target >= 70%)")
        cpu = results["floor"]["c32"]["cpu_us"] / results["gw-l1-w1"]["c32"]["cpu_us"]
        print(f"  by server CPU per request (less sensitive to a busy machine): {cpu:.0%}")
    if "gw-l1-w1" in results and "steady" in results["gw-l1-w1"]:
        p99 = results["gw-l1-w1"]["steady"]["p99_ms"]
        print(f"L1 hit p99 at {rate}/s: {p99:.3f} ms (target <= 1 ms)")
    if "gw-l2-w1" in results:
        print(
            f"Redis hit p50 (1 conn): {results['gw-l2-w1']['c1']['p50_ms']:.3f} ms (target <= 1 ms)"
        )


if __name__ == "__main__":
    raise SystemExit(main())
