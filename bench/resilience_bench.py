"""Resilience under replica faults: latentgate (each feature on and off) against nginx.

One command: .venv/bin/python bench/resilience_bench.py [--requests 500] [--concurrency 8]
Three replicas (tests/support/upstream.py processes) behind each proxy; faults: none, one
replica killed a fifth of the way in, one replica slowed by 200 ms, one replica answering 500.
Prints p50/p95/p99 (ms), error rate and throughput per proxy and fault, side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.servers import GatewayProcess, free_port, wait_port  # noqa: E402

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
FAULTS: dict[str, tuple[str, ...]] = {
    "healthy": (),
    "killed": (),
    "slow 200ms": ("--delay", "0.2"),
    "500s": ("--fail-status", "500"),
}
HEDGE = {"after_percentile": 90, "after_ms": 20}


def gateway_config(urls: list[str], *, hedge: bool, retries: bool, eject: bool) -> dict[str, Any]:
    backend: dict[str, Any] = {
        "kind": "remote",
        "replicas": urls,
        "timeouts": {"connect": 1, "read": 10, "total": 10},
    }
    if eject:
        backend["health_check"] = {"path": "/health", "interval_s": 1}
    else:
        backend["outlier"] = {"enabled": False}
    upstream: dict[str, Any] = {}
    if hedge:
        upstream["hedge"] = HEDGE
    if not retries:
        upstream["retries"] = {"max": 0}
    route = {
        "name": "chat",
        "match": {"path": "/v1/chat/completions"},
        "protocol": "openai",
        "backend": "pool",
        "upstream": upstream,
    }
    return {"backends": {"pool": backend}, "routes": [route], "logging": {"level": "error"}}


NGINX_CONF = """
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log crit;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fcgi; uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
  upstream pool {{
    least_conn;
{servers}
    keepalive 64;
  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://pool;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_next_upstream error timeout http_502 http_503 http_504 non_idempotent;
      proxy_next_upstream_tries 3;
      proxy_connect_timeout 1s;
      proxy_read_timeout 10s;
    }}
  }}
}}
"""


class Nginx:
    def __init__(self, urls: list[str]) -> None:
        self.tmp = tempfile.mkdtemp(prefix="lg-nginx-")
        self.port = free_port()
        servers = "\n".join(
            f"    server {u.removeprefix('http://')} max_fails=3 fail_timeout=30s;" for u in urls
        )
        conf = Path(self.tmp) / "nginx.conf"
        conf.write_text(NGINX_CONF.format(tmp=self.tmp, servers=servers, port=self.port))
        self.proc = subprocess.Popen(
            ["nginx", "-p", self.tmp, "-c", str(conf)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port("127.0.0.1", self.port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class Gateway:
    def __init__(self, urls: list[str], **features: bool) -> None:
        self.proc = GatewayProcess(gateway_config(urls, **features)).start()
        self.url = self.proc.url

    def stop(self) -> None:
        self.proc.stop()


PROXIES: dict[str, Callable[[list[str]], Any]] = {
    "latentgate (all)": lambda u: Gateway(u, hedge=True, retries=True, eject=True),
    "latentgate -hedging": lambda u: Gateway(u, hedge=False, retries=True, eject=True),
    "latentgate -retries": lambda u: Gateway(u, hedge=True, retries=False, eject=True),
    "latentgate -ejection": lambda u: Gateway(u, hedge=True, retries=True, eject=False),
    "nginx": Nginx,
}


def start_replicas(fault: str) -> tuple[list[subprocess.Popen[bytes]], list[int]]:
    procs, ports = [], []
    for i in range(3):
        port = free_port()
        extra = FAULTS[fault] if i == 0 else ()
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.support.upstream",
                    "--port",
                    str(port),
                    "--name",
                    f"r{i}",
                    *extra,
                ],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        ports.append(port)
    for p in ports:
        wait_port("127.0.0.1", p)
    return procs, ports


async def drive(url: str, n: int, c: int, on_progress: Callable[[int], None]) -> dict[str, float]:
    lat: list[float] = []
    errors = 0
    todo = iter(range(n))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=c)) as s:

        async def worker() -> None:
            nonlocal errors
            for _ in todo:
                t = time.perf_counter()
                try:
                    async with s.post(url + "/v1/chat/completions", json=CHAT) as r:
                        await r.read()
                        errors += r.status >= 400
                except aiohttp.ClientError:
                    errors += 1
                lat.append(time.perf_counter() - t)
                on_progress(len(lat))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(c)))
        wall = time.perf_counter() - t0
    lat.sort()

    def q(p: float) -> float:
        return lat[min(len(lat) - 1, int(p / 100 * len(lat)))] * 1000

    return {"p50": q(50), "p95": q(95), "p99": q(99), "err%": 100 * errors / n, "rps": n / wall}


async def warm(url: str) -> None:
    async with aiohttp.ClientSession() as s:
        for _ in range(30):
            async with s.post(url + "/v1/chat/completions", json=CHAT) as r:
                await r.read()


def run_one(proxy: str, fault: str, n: int, c: int) -> dict[str, float]:
    procs, ports = start_replicas(fault)
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    front = PROXIES[proxy](urls)
    try:
        if fault != "killed":
            asyncio.run(warm(front.url))

        def progress(done: int) -> None:
            if fault == "killed" and done == n // 5:
                procs[1].kill()

        return asyncio.run(drive(front.url, n, c, progress))
    finally:
        front.stop()
        for p in procs:
            p.kill()
            p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--concurrency", type=int, default=8)
    args = ap.parse_args()
    os.chdir(ROOT)
    print(
        f"# {args.requests} chat requests per cell, concurrency {args.concurrency}, "
        f"3 replicas; hedge={HEDGE}"
    )
    rows: dict[tuple[str, str], dict[str, float]] = {}
    for fault in FAULTS:
        for proxy in PROXIES:
            rows[proxy, fault] = r = run_one(proxy, fault, args.requests, args.concurrency)
            print(
                f"{fault:<11} {proxy:<22} p50 {r['p50']:7.1f}  p95 {r['p95']:7.1f}  "
                f"p99 {r['p99']:7.1f} ms  err {r['err%']:5.1f}%  {r['rps']:6.0f} rps",
                flush=True,
            )
    print("\n| fault | proxy | p50 ms | p95 ms | p99 ms | p99 / healthy p99 | errors | rps |")
    print("|---|---|---|---|---|---|---|---|")
    for (proxy, fault), r in rows.items():
        ratio = r["p99"] / rows[proxy, "healthy"]["p99"]
        print(
            f"| {fault} | {proxy} | {r['p50']:.1f} | {r['p95']:.1f} | {r['p99']:.1f} | "
            f"{ratio:.2f}x | {r['err%']:.1f} % | {r['rps']:.0f} |"
        )


if __name__ == "__main__":
    main()
