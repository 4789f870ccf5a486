"""`latentgate profile URL`: send traffic, read each answer's Server-Timing, and report p50/p99 per
stage as a table (and, with --plot, a chart; matplotlib is the optional `plot` extra).

Only a client: it never imports the gateway's serving code.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

CLIENT_STAGE = "client"  # wall time seen by this client, beside the gateway's own stages


def parse_server_timing(header: str) -> dict[str, float]:
    """`name;dur=1.2;desc="x", other;dur=3` → {"name": 1.2, "other": 3.0} (milliseconds)."""
    out: dict[str, float] = {}
    for part in header.split(","):
        items = [p.strip() for p in part.split(";")]
        name = items[0]
        if not name:
            continue
        for item in items[1:]:
            key, _, value = item.partition("=")
            if key.strip().lower() == "dur":
                with contextlib.suppress(ValueError):  # a malformed dur is skipped, not fatal
                    out[name] = out.get(name, 0.0) + float(value.strip().strip('"'))
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of unsorted values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass
class ProfileResult:
    stages: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    statuses: Counter[int] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def requests(self) -> int:
        return sum(self.statuses.values()) + sum(self.errors.values())

    def summary(self) -> list[tuple[str, int, float, float, float]]:
        """(stage, count, p50, p99, mean) in first-seen order, the client's view last."""
        rows = []
        for name, values in self.stages.items():
            if name == CLIENT_STAGE:
                continue
            rows.append(
                (
                    name,
                    len(values),
                    percentile(values, 50),
                    percentile(values, 99),
                    sum(values) / len(values),
                )
            )
        client = self.stages.get(CLIENT_STAGE, [])
        if client:
            rows.append(
                (
                    CLIENT_STAGE,
                    len(client),
                    percentile(client, 50),
                    percentile(client, 99),
                    sum(client) / len(client),
                )
            )
        return rows


def format_table(result: ProfileResult) -> str:
    lines = [f"{'stage':<16} {'count':>7} {'p50 ms':>10} {'p99 ms':>10} {'mean ms':>10}"]
    lines.append("-" * len(lines[0]))
    for name, count, p50, p99, mean in result.summary():
        lines.append(f"{name:<16} {count:>7} {p50:>10.3f} {p99:>10.3f} {mean:>10.3f}")
    rate = result.requests / result.seconds if result.seconds else 0.0
    statuses = ", ".join(f"{k}: {v}" for k, v in sorted(result.statuses.items()))
    lines.append(
        f"{result.requests} requests in {result.seconds:.2f}s ({rate:.0f}/s); "
        f"status {statuses or '-'}"
    )
    if result.errors:
        lines.append("errors: " + ", ".join(f"{k}: {v}" for k, v in result.errors.items()))
    if not any(n != CLIENT_STAGE for n in result.stages):
        lines.append("no Server-Timing header in the answers: is the URL a latentgate route?")
    return "\n".join(lines)


async def run_profile(
    url: str,
    *,
    requests: int = 200,
    concurrency: int = 8,
    body: bytes | None = None,
    method: str | None = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
) -> ProfileResult:
    result = ProfileResult()
    verb = method or ("POST" if body is not None else "GET")
    hdrs = dict(headers or {})
    if body is not None:
        hdrs.setdefault("Content-Type", "application/json")
    remaining = requests

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            try:
                async with session.request(verb, url, data=body, headers=hdrs) as resp:
                    await resp.read()  # the stage timings describe the whole answer
                    result.statuses[resp.status] += 1
                    for name, ms in parse_server_timing(
                        resp.headers.get("Server-Timing", "")
                    ).items():
                        result.stages[name].append(ms)
            except (aiohttp.ClientError, TimeoutError) as exc:
                result.errors[type(exc).__name__] += 1
                continue
            result.stages[CLIENT_STAGE].append((time.perf_counter() - started) * 1000)

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    connector = aiohttp.TCPConnector(limit=concurrency)
    started = time.perf_counter()
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        await asyncio.gather(*(worker(session) for _ in range(max(1, concurrency))))
    result.seconds = time.perf_counter() - started
    return result


def plot(result: ProfileResult, path: str, title: str = "latentgate profile") -> None:
    """p50 and p99 per stage as grouped horizontal bars, written to `path` (PNG)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install 'latentgate[plot]'") from None
    rows = result.summary()
    names = [r[0] for r in rows]
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.5 * len(rows)))
    ys = list(range(len(rows)))
    ax.barh([y - 0.2 for y in ys], [r[2] for r in rows], height=0.4, label="p50")
    ax.barh([y + 0.2 for y in ys], [r[3] for r in rows], height=0.4, label="p99")
    ax.set_yticks(ys, names)
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds")
    ax.set_title(f"{title} ({result.requests} requests)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(args: argparse.Namespace) -> int:
    """The `profile` subcommand: flags parsed by gateway/cli.py."""
    body = Path(args.body).read_bytes() if args.body else None
    headers = dict(h.split(":", 1) for h in args.header if ":" in h)
    headers = {k.strip(): v.strip() for k, v in headers.items()}
    result = asyncio.run(
        run_profile(
            args.url,
            requests=args.requests,
            concurrency=args.concurrency,
            body=body,
            method=args.method,
            headers=headers,
        )
    )
    print(format_table(result))
    if args.plot:
        try:
            plot(result, args.plot, title=f"latentgate profile {args.url}")
        except RuntimeError as err:
            print(err, file=sys.stderr)
            return 2
        print(f"chart written to {args.plot}")
    return 0 if result.statuses else 1
