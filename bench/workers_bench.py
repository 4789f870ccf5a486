"""Multi-core: `latentgate serve --workers 1` against `--workers 2` in ONE run, same upstream,
same load generator (wrk -t1), printing p50/p95/p99, throughput and every party's CPU use.

On a 2-core machine the load generator, the upstream and the gateway workers share the same two
cores: the CPU columns say how much each took. Routes: pass-through GET, a parsed (uncached) chat,
and exact-cache hits (memory tier; each worker fills its own L1 on its first request).

  python bench/workers_bench.py [--duration 10] [--connections 32] [--workers 1 2]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.servers import free_port, wait_port  # noqa: E402

LUA = """
wrk.method = os.getenv("LG_METHOD") or "GET"
local body = os.getenv("LG_BODY")
if body and body ~= "" then
  wrk.body = body
  wrk.headers["Content-Type"] = "application/json"
end
done = function(summary, latency, requests)
  io.write(string.format("LGSTATS %d %d %.3f %.3f %.3f %d\\n", summary.requests,
    summary.duration, latency:percentile(50), latency:percentile(95), latency:percentile(99),
    summary.errors.status + summary.errors.connect + summary.errors.read
    + summary.errors.write + summary.errors.timeout))
end
"""

CHAT = '{"model":"m","messages":[{"role":"user","content":"bench"}]}'
ROUTES = {
    "passthrough": ("GET", "/v1/models", ""),
    "openai-chat": ("POST", "/v1/chat/completions", CHAT),
    # The exact cache on /v1/completions (memory tier): after the first request, every one a hit.
    "hit": ("POST", "/v1/completions", '{"model":"m","prompt":"bench"}'),
}


@dataclass
class Result:
    workers: int
    route: str
    rps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    errors: int
    wrk_cpu: float
    gateway_cpu: float
    upstream_cpu: float


def config(upstream: str, port: int) -> dict[str, Any]:
    return {
        "listeners": [{"name": "main", "host": "127.0.0.1", "port": port}],
        "logging": {"level": "warning"},
        "backends": {"upstream": {"kind": "remote", "replicas": [upstream]}},
        "routes": [
            {
                "name": "chat",
                "match": {"path": "/v1/chat/completions", "methods": ["POST"]},
                "protocol": "openai",
                "backend": "upstream",
            },
            {
                "name": "completions",
                "match": {"path": "/v1/completions", "methods": ["POST"]},
                "protocol": "openai",
                "backend": "upstream",
                "cache": {"exact": {"enabled": True, "tiers": ["memory"]}},
            },
            {
                "name": "default",
                "match": {"prefix": "/"},
                "protocol": "passthrough",
                "backend": "upstream",
            },
        ],
    }


def cpu_seconds(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def family(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def wrk(
    url: str,
    route: str,
    duration: float,
    connections: int,
    lua: str,
    watch: dict[str, list[psutil.Process]],
) -> tuple[list[float], dict[str, float]]:
    method, _, body = ROUTES[route]
    env = {**os.environ, "LG_METHOD": method, "LG_BODY": body}
    before = {k: cpu_seconds(v) for k, v in watch.items()}
    started = time.monotonic()
    proc = subprocess.Popen(
        ["wrk", "-t1", f"-c{connections}", f"-d{duration:.0f}s", "-s", lua, url],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    out = proc.stdout.read()
    # wait4 gives the exact CPU time of wrk (all its threads) at exit.
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wrk_cpu = usage.ru_utime + usage.ru_stime
    wall = time.monotonic() - started
    m = re.search(r"LGSTATS (\d+) (\d+) ([\d.]+) ([\d.]+) ([\d.]+) (\d+)", out)
    if m is None:
        raise RuntimeError(f"wrk printed no stats:\n{out}")
    n, dur_us, p50, p95, p99, errors = m.groups()
    rps = int(n) / (int(dur_us) / 1e6)
    cpu = {k: (cpu_seconds(v) - before[k]) / wall * 100 for k, v in watch.items()}
    cpu["wrk"] = wrk_cpu / wall * 100
    return [rps, float(p50) / 1000, float(p95) / 1000, float(p99) / 1000, float(errors)], cpu


def run(args: argparse.Namespace) -> list[Result]:
    results: list[Result] = []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    up_port = free_port()
    upstream = subprocess.Popen(
        [sys.executable, "-m", "tests.support.upstream", "--port", str(up_port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    lua_fd, lua = tempfile.mkstemp(suffix=".lua")
    with os.fdopen(lua_fd, "w") as f:
        f.write(LUA)
    try:
        wait_port("127.0.0.1", up_port)
        for workers in args.workers:
            port = free_port()
            fd, path = tempfile.mkstemp(suffix=".yaml", prefix="lg-workers-")
            with os.fdopen(fd, "w") as f:
                yaml.safe_dump(config(f"http://127.0.0.1:{up_port}", port), f)
            gw = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gateway",
                    "serve",
                    "--config",
                    path,
                    "--workers",
                    str(workers),
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                wait_port("127.0.0.1", port, 60)
                time.sleep(1.0)  # every worker bound and serving
                watch = {"gateway": family(gw.pid), "upstream": [psutil.Process(upstream.pid)]}
                for route in args.routes:
                    url = f"http://127.0.0.1:{port}{ROUTES[route][1]}"
                    wrk(url, route, 2, args.connections, lua, watch)  # warm-up, discarded
                    (rps, p50, p95, p99, errors), cpu = wrk(
                        url, route, args.duration, args.connections, lua, watch
                    )
                    results.append(
                        Result(
                            workers,
                            route,
                            rps,
                            p50,
                            p95,
                            p99,
                            int(errors),
                            cpu["wrk"],
                            cpu["gateway"],
                            cpu["upstream"],
                        )
                    )
                    print(f"  workers={workers} {route}: {rps:.0f} req/s", flush=True)
            finally:
                gw.terminate()
                gw.wait(30)
                os.unlink(path)
    finally:
        upstream.terminate()
        upstream.wait(30)
        os.unlink(lua)
    return results


def table(results: list[Result]) -> str:
    head = (
        "| workers | route | req/s | p50 ms | p95 ms | p99 ms | errors | wrk CPU % "
        "| gateway CPU % | upstream CPU % |"
    )
    lines = [head, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(
            f"| {r.workers} | {r.route} | {r.rps:.0f} | {r.p50_ms:.2f} | {r.p95_ms:.2f} "
            f"| {r.p99_ms:.2f} | {r.errors} | {r.wrk_cpu:.0f} | {r.gateway_cpu:.0f} "
            f"| {r.upstream_cpu:.0f} |"
        )
    base = {r.route: r.rps for r in results if r.workers == min(x.workers for x in results)}
    for r in results:
        if r.route in base and r.rps and r.workers != min(x.workers for x in results):
            lines.append(
                f"\n{r.route}: {r.workers} workers / 1 worker = {r.rps / base[r.route]:.2f}x"
            )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument(
        "--routes", nargs="+", default=["passthrough", "openai-chat", "hit"], choices=sorted(ROUTES)
    )
    args = ap.parse_args()
    print(
        f"cores: {os.cpu_count()}; wrk -t1 -c{args.connections} -d{args.duration:.0f}s; "
        "load generator, upstream and gateway share these cores",
        flush=True,
    )
    print(table(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
