"""Open-loop, fixed-rate HTTP/1.1 load generator (wrk2 is not in Debian): sends on a schedule
whatever the answers do, and records each request's latency from its send to its last byte.

Usage: python bench/openloop.py HOST PORT PATH --rate 500 --duration 10 --body JSON (→ JSON).
Requests go over pre-opened keep-alive connections; a request that falls due while every connection
is busy is counted as `late` (the target could not keep up) instead of being queued behind others.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
from collections import deque

import uvloop


class _Conn(asyncio.Protocol):
    def __init__(self, gen: _Gen) -> None:
        self.gen = gen
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.sent_at = 0.0
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, payload: bytes) -> None:
        assert self.transport is not None
        self.busy = True
        self.sent_at = time.perf_counter()
        self.transport.write(payload)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buf[:end]).lower()
        status = int(head[9:12])
        i = head.find(b"content-length:")
        if i >= 0:
            length = int(head[i + 15 : head.index(b"\r\n", i) if b"\r\n" in head[i:] else None])
            if len(self.buf) < end + 4 + length:
                return
            del self.buf[: end + 4 + length]
        elif self.buf.endswith(b"0\r\n\r\n"):  # chunked: the terminating chunk
            self.buf.clear()
        else:
            return
        self.busy = False
        self.gen.done(self, now - self.sent_at, status)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.gen.lost(self)


class _Gen:
    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.idle: deque[_Conn] = deque()
        self.latencies: list[float] = []
        self.lags: list[float] = []
        self.errors = 0
        self.late = 0
        self.record = False
        self.outstanding = 0

    def done(self, conn: _Conn, latency: float, status: int) -> None:
        self.outstanding -= 1
        if self.record:
            self.latencies.append(latency)
            if status >= 400:
                self.errors += 1
        self.idle.append(conn)

    def lost(self, conn: _Conn) -> None:
        if conn.busy:
            self.outstanding -= 1
            self.errors += 1
        if conn in self.idle:
            self.idle.remove(conn)

    async def phase(self, rate: float, seconds: float, record: bool) -> None:
        self.record = record
        loop = asyncio.get_running_loop()
        n = int(rate * seconds)
        start = time.perf_counter() + 0.01
        for i in range(n):
            due = start + i / rate
            wait = due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            if not self.idle:
                if record:
                    self.late += 1
                continue
            conn = self.idle.popleft()
            self.outstanding += 1
            conn.send(self.payload)
            if record:
                self.lags.append(conn.sent_at - due)
        deadline = loop.time() + 10
        while self.outstanding > 0 and loop.time() < deadline:  # noqa: ASYNC110 - a plain drain poll
            await asyncio.sleep(0.005)


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


async def run(args: argparse.Namespace) -> dict[str, object]:
    body = args.body.encode()
    payload = (
        f"POST {args.path} HTTP/1.1\r\nHost: {args.host}:{args.port}\r\n"
        f"Content-Type: application/json\r\nAuthorization: Bearer {args.auth}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    gen = _Gen(payload)
    loop = asyncio.get_running_loop()
    for _ in range(args.connections):
        _, conn = await loop.create_connection(lambda: _Conn(gen), args.host, args.port)
        gen.idle.append(conn)
    await gen.phase(args.rate, args.warmup, record=False)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    await gen.phase(args.rate, args.duration, record=True)
    elapsed = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    n = len(gen.latencies)
    ms = [x * 1000 for x in gen.latencies]
    return {
        "rate": args.rate,
        "completed": n,
        "late": gen.late,
        "errors": gen.errors,
        "achieved_rps": n / elapsed if elapsed else 0.0,
        "p50_ms": _pct(ms, 50),
        "p90_ms": _pct(ms, 90),
        "p99_ms": _pct(ms, 99),
        "p999_ms": _pct(ms, 99.9),
        "max_ms": max(ms) if ms else float("nan"),
        "send_lag_p50_ms": _pct([x * 1000 for x in gen.lags], 50),
        "send_lag_p99_ms": _pct([x * 1000 for x in gen.lags], 99),
        "generator_cpu_us_per_req": cpu / n * 1e6 if n else float("nan"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("path")
    ap.add_argument("--rate", type=float, default=500)
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--warmup", type=float, default=1)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--body", default='{"model":"m","messages":[{"role":"user","content":"hi"}]}')
    ap.add_argument("--auth", default="none")
    args = ap.parse_args()
    print(json.dumps(uvloop.run(run(args))))


if __name__ == "__main__":
    main()
