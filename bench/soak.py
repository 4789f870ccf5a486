"""Soak: mixed traffic against a real `latentgate serve` process for a set time, sampling the
gateway's RSS and open file descriptors every --interval seconds; prints the series and a verdict.

Traffic mix: pass-through GETs, chat misses (unique prompts), repeated chats (exact hits once the
exact cache is on the route: the X-Cache tally says), SSE streams, upstream embeddings, local
embeddings on the ONNX engine (the packaged MiniLM) and v2 infer.
Verdict: RSS growth after warm-up < 5 % and no descriptor growth.

  python bench/soak.py --duration 600 --interval 10 --concurrency 16 [--markdown]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.servers import free_port, wait_port  # noqa: E402


@dataclass
class Sample:
    t: float
    rss_mib: float
    fds: int
    requests: int


@dataclass
class Tally:
    requests: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    x_cache: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)


def gateway_config(upstream: str, port: int, exact: bool, read_s: float = 30) -> dict[str, Any]:
    policy = {"exact": {"enabled": True}} if exact else {}
    return {
        "listeners": [{"name": "main", "host": "127.0.0.1", "port": port}],
        "logging": {"level": "warning"},
        # A small L1 bound: unique misses fill it during warm-up, then the LRU must hold it flat.
        "cache": {"memory": {"max_bytes": 4 << 20}},
        "backends": {
            "upstream": {
                "kind": "remote",
                "replicas": [upstream],
                "timeouts": {"connect": 2, "read": read_s, "total": 60},
            },
            # The local ONNX engine (issue 5): the packaged MiniLM behind the dynamic batcher.
            "minilm": {
                "kind": "onnxruntime",
                "model": "builtin:all-MiniLM-L6-v2",
                "providers": ["CPUExecutionProvider"],
                "session": {"intra_op_threads": 1},
            },
        },
        "routes": [
            {
                "name": "local-embeddings",
                "match": {
                    "path": "/v1/embeddings",
                    "methods": ["POST"],
                    "model": "all-MiniLM-L6-v2",
                },
                "protocol": "openai",
                "backend": "minilm",
            },
            {
                "name": "chat",
                "match": {"path": "/v1/chat/completions", "methods": ["POST"]},
                "protocol": "openai",
                "backend": "upstream",
                "cache": policy,
            },
            {
                "name": "embeddings",
                "match": {"path": "/v1/embeddings", "methods": ["POST"]},
                "protocol": "openai",
                "backend": "upstream",
                "cache": policy,
            },
            {"name": "v2", "match": {"prefix": "/v2/"}, "protocol": "v2", "backend": "upstream"},
            {
                "name": "default",
                "match": {"prefix": "/"},
                "protocol": "passthrough",
                "backend": "upstream",
            },
        ],
    }


def _requests() -> itertools.cycle[tuple[str, str, Any]]:
    def chat(text: str, stream: bool = False) -> dict[str, Any]:
        return {
            "model": "m",
            "temperature": 0,
            "stream": stream,
            "messages": [{"role": "user", "content": text}],
        }

    mix: list[tuple[str, str, Any]] = [
        ("GET", "/v1/models", None),
        ("POST", "/v1/chat/completions", "miss"),
        ("POST", "/v1/chat/completions", chat("the same question every time")),
        ("POST", "/v1/chat/completions", chat("the same question every time")),
        ("POST", "/v1/chat/completions", "stream"),
        ("POST", "/v1/embeddings", {"model": "e", "input": ["alpha beta", "gamma"]}),
        ("POST", "/v1/embeddings", "local"),
        (
            "POST",
            "/v2/models/m/infer",
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]},
        ),
    ]
    return itertools.cycle(mix)


async def traffic(base: str, concurrency: int, stop: asyncio.Event, tally: Tally) -> None:
    mix = _requests()
    seq = itertools.count()

    async def worker(session: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            method, path, body = next(mix)
            if body == "miss":
                body = {"model": "m", "messages": [{"role": "user", "content": f"q {next(seq)}"}]}
            elif body == "local":
                body = {"model": "all-MiniLM-L6-v2", "input": [f"sentence {next(seq)}", "fixed"]}
            elif body == "stream":
                body = {
                    "model": "m",
                    "stream": True,
                    "messages": [{"role": "user", "content": f"s {random.random()}"}],
                }
            try:
                async with session.request(method, base + path, json=body) as resp:
                    async for _ in resp.content.iter_any():
                        pass
                    tally.statuses[resp.status] += 1
                    tally.x_cache[resp.headers.get("X-Cache", "none")] += 1
            except (aiohttp.ClientError, TimeoutError) as exc:
                tally.errors[type(exc).__name__] += 1
            tally.requests += 1

    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=concurrency)
    ) as s:
        await asyncio.gather(*(worker(s) for _ in range(concurrency)))


async def reloads(every: float, cfg_path: str, make: Any, pid: int, stop: asyncio.Event) -> int:
    """Every `every` s: rewrite the config so the pool's settings differ, then SIGHUP; each reload
    replaces the backend, so leaked pools would show as descriptor growth."""
    n = 0
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), every)
        except TimeoutError:
            n += 1
            text = yaml.safe_dump(make(30 + n % 2))
            await asyncio.to_thread(Path(cfg_path).write_text, text)
            os.kill(pid, 1)  # SIGHUP
    return n


async def sample(
    proc: psutil.Process, duration: float, interval: float, tally: Tally, stop: asyncio.Event
) -> list[Sample]:
    series: list[Sample] = []
    started = time.monotonic()
    while True:
        elapsed = time.monotonic() - started
        mem = proc.memory_info().rss / (1 << 20)
        series.append(Sample(elapsed, mem, proc.num_fds(), tally.requests))
        print(
            f"  t={elapsed:6.0f}s  rss={mem:7.1f} MiB  fds={series[-1].fds:4d}  "
            f"requests={tally.requests}",
            flush=True,
        )
        if elapsed >= duration:
            break
        await asyncio.sleep(min(interval, max(0.0, duration - elapsed)))
    stop.set()
    return series


def verdict(series: list[Sample], warmup_s: float) -> tuple[bool, str]:
    """Growth, not spikes: RSS last vs after warm-up; fds as the median of the last five samples
    against the warm-up sample (a reload briefly holds the old and the new pool's connections)."""
    warm = next((s for s in series if s.t >= warmup_s), series[0])
    last = series[-1]
    growth = (last.rss_mib - warm.rss_mib) / warm.rss_mib * 100
    late = [s.fds for s in series if s.t >= warm.t]
    tail = sorted(s.fds for s in series[-5:])
    fd_growth = tail[len(tail) // 2] - warm.fds
    ok = growth < 5.0 and fd_growth <= 2
    text = (
        f"RSS {warm.rss_mib:.1f} MiB at t={warm.t:.0f}s (after warm-up) → {last.rss_mib:.1f} MiB "
        f"at t={last.t:.0f}s: {growth:+.2f} % (limit < 5 %); fds {warm.fds} after warm-up → "
        f"{tail[len(tail) // 2]} at the end (growth {fd_growth:+d}, limit +2; range "
        f"{min(late)}..{max(late)}): {'PASS' if ok else 'FAIL'}"
    )
    return ok, text


def markdown(series: list[Sample]) -> str:
    lines = ["| t (s) | RSS (MiB) | open fds | requests |", "|---:|---:|---:|---:|"]
    lines += [f"| {s.t:.0f} | {s.rss_mib:.1f} | {s.fds} | {s.requests} |" for s in series]
    return "\n".join(lines)


async def soak(
    args: argparse.Namespace, gw_port: int, up_port: int, cfg_path: str, pid: int
) -> tuple[list[Sample], Tally]:
    print(
        f"soak: {args.duration:.0f}s, concurrency {args.concurrency}, sampling every "
        f"{args.interval:.0f}s; gateway pid {pid}",
        flush=True,
    )
    tally, stop = Tally(), asyncio.Event()
    load = asyncio.create_task(
        traffic(f"http://127.0.0.1:{gw_port}", args.concurrency, stop, tally)
    )

    def make(read_s: float) -> dict[str, Any]:
        return gateway_config(f"http://127.0.0.1:{up_port}", gw_port, args.exact_cache, read_s)

    reloader = asyncio.create_task(
        reloads(args.reload_every, cfg_path, make, pid, stop)
        if args.reload_every > 0
        else stop.wait()
    )
    series = await sample(psutil.Process(pid), args.duration, args.interval, tally, stop)
    await load
    n_reloads = await reloader
    if args.reload_every > 0:
        print(f"reloads (SIGHUP, backend replaced each time): {n_reloads}")
    return series, tally


def run(args: argparse.Namespace) -> int:
    up_port, gw_port = free_port(), free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    upstream = subprocess.Popen(
        [sys.executable, "-m", "tests.support.upstream", "--port", str(up_port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    cfg_fd, cfg_path = tempfile.mkstemp(suffix=".yaml", prefix="lg-soak-")
    with os.fdopen(cfg_fd, "w") as f:
        yaml.safe_dump(gateway_config(f"http://127.0.0.1:{up_port}", gw_port, args.exact_cache), f)
    with open(cfg_path + ".log", "wb") as log:
        gateway = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", cfg_path],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_port("127.0.0.1", up_port)
            wait_port("127.0.0.1", gw_port, 60)
            series, tally = asyncio.run(soak(args, gw_port, up_port, cfg_path, gateway.pid))
        finally:
            gateway.terminate()
            upstream.terminate()
            gateway.wait(30)
            upstream.wait(30)
    ok, text = verdict(series, args.warmup)
    rate = tally.requests / series[-1].t if series[-1].t else 0
    print(
        f"\nrequests {tally.requests} ({rate:.0f}/s); status {dict(tally.statuses)}; "
        f"X-Cache {dict(tally.x_cache)}; client errors {dict(tally.errors)}"
    )
    print(text)
    if args.markdown:
        print("\n" + markdown(series))
    if args.json:
        doc = {"series": [s.__dict__ for s in series], "verdict": text, "ok": ok}
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--interval", type=float, default=10)
    ap.add_argument("--warmup", type=float, default=60, help="seconds before the baseline sample")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument(
        "--reload-every",
        type=float,
        default=0,
        help="SIGHUP with a changed pool every N s (0: never)",
    )
    ap.add_argument("--exact-cache", action="store_true", help="enable the exact cache on chat")
    ap.add_argument("--markdown", action="store_true", help="also print the series as a table")
    ap.add_argument("--json", help="write the series and verdict to this file")
    return run(ap.parse_args())


if __name__ == "__main__":
    sys.exit(main())
