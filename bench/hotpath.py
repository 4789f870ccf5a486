"""The gateway's hot path side by side, in one run: `python -m bench.hotpath`.

Every setup is a real process on 127.0.0.1, started here; the upstream is nginx answering a
fixed chat.completion (bench/peers.py), so the upstream costs next to nothing.

  nginx keep-alive proxy         the C floor for a pass-through
  bare aiohttp+uvloop proxy      the Python floor for a pass-through (bench/bare_proxy.py)
  latentgate pass-through        the default config (config/latentgate.yaml), chat route,
                                 `Cache-Control: no-store` (no lookup, no store, no semantic)
  nginx POST cache hit           proxy_cache keyed on the body: the C floor for a hit
  aiohttp+uvloop dict lookup     the Python floor for a hit (bench/dict_floor.py)
  latentgate exact hit           the default config, the same body again and again (L1 hits)
  latentgate semantic miss       the default config, a new deterministic question each time:
                                 exact miss, embed, index search, upstream, store, index

wrk -t1 at 1 and 32 connections (-c32 is the headline), setups in turns, `--rounds` times; the
table shows medians. CPU µs per request is the server process's user + system time (from
/proc, all threads) over the 32-connection run, divided by the requests it answered: the figure
that survives a shared, noisy machine best.

`--profile` also records a py-spy flame graph of latentgate during each of its 32-connection
runs (bench/results/hotpath-<row>-<time>.svg; py-spy comes with the `bench` extra). Sampling
costs the gateway CPU: read a profiled run's figures as a profile, not as a benchmark.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import peers
from bench.proxy_bench import PATH, fmt_ms, wrk

NO_STORE = "Cache-Control: no-store"
RESULTS = Path(__file__).with_name("results")
# Deterministic (temperature 0): the default config caches only calls whose answer is determined.
BODY = json.dumps(
    {
        "model": "m",
        "max_tokens": 16,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Hello there, how are you today?"}],
    },
    separators=(",", ":"),
)


@dataclass
class Row:
    key: str
    label: str
    target: str  # which started process answers
    header: str = ""
    unique: bool = False
    runs: list[dict[str, dict[str, float]]] = field(default_factory=list)


def rows() -> list[Row]:
    return [
        Row("nginx-proxy", "nginx keep-alive proxy", "nginx-proxy"),
        Row("bare-proxy", "bare aiohttp+uvloop proxy", "bare"),
        Row("lg-pass", "latentgate pass-through (no-store)", "latentgate", header=NO_STORE),
        Row("nginx-hit", "nginx POST cache hit", "nginx-cache"),
        Row("dict", "aiohttp+uvloop dict lookup", "dict"),
        Row("lg-hit", "latentgate exact hit", "latentgate"),
        Row("lg-semantic-miss", "latentgate semantic miss", "latentgate", unique=True),
    ]


def x_cache(port: int, header: str) -> str:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {peers.MASTER_KEY}"}
    if header:
        k, v = header.split(":", 1)
        headers[k] = v.strip()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{PATH}", data=BODY.encode(), method="POST", headers=headers
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()
        return str(resp.headers.get("X-Cache") or resp.headers.get("X-Cache-Status") or "-")


def py_spy(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    """py-spy (the `bench` extra) sampling the gateway into a flame graph while wrk runs."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(exe).exists():
        raise SystemExit("--profile needs py-spy: pip install -e '.[bench]'")
    cmd = [exe, "record", "-p", str(pid), "-d", str(max(1, round(seconds))), "-r", "200"]
    cmd += ["--nonblocking", "-o", str(out)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measure(
    row: Row, target: peers.Target, seconds: float, profile: Path | None = None
) -> dict[str, dict[str, float]]:
    def run(conns: int, secs: float) -> dict[str, float]:
        # a new question sequence every run: a repeat would be an exact hit
        os.environ["BENCH_SEED"] = str(random.randrange(1, 2**31))
        return wrk(target.port, conns, secs, body=BODY, header=row.header, unique=row.unique)

    run(4, 1)  # warm-up: connections, pools, the first embeddings
    out = {"c1": run(1, seconds)}
    spy = None
    if profile is not None and target.name.startswith("latentgate") and target.proc is not None:
        spy = py_spy(target.proc.pid, seconds, profile)
    cpu0 = target.cpu_seconds()
    out["c32"] = run(32, seconds)
    out["c32"]["cpu_us_per_req"] = (
        (target.cpu_seconds() - cpu0) / max(1, out["c32"]["requests"]) * 1e6
    )
    if spy is not None:
        spy.wait(60)
        print(f"{row.label}: flame graph {profile}", file=sys.stderr)
    return out


def medians(runs: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    return {
        phase: {k: statistics.median(r[phase][k] for r in runs) for k in runs[0][phase]}
        for phase in runs[0]
    }


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def report(done: list[Row], args: argparse.Namespace) -> str:
    med = {r.key: medians(r.runs) for r in done if r.runs}
    lines = [
        f"hot path, POST {PATH} ({len(BODY)}-byte body), wrk -t1, {args.seconds:.0f}s per run, "
        f"{args.rounds} round(s), medians; {datetime.date.today()}, "
        f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}",
        "",
        "| setup | c1 req/s | c1 p50 / p95 / p99 | c32 req/s | c32 p50 / p95 / p99 | "
        "CPU/req (c32) | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in done:
        if r.key not in med:
            continue
        c1, c32 = med[r.key]["c1"], med[r.key]["c32"]
        errs = c1["errors"] + c32["errors"]
        lines.append(
            f"| {r.label} | {c1['rps']:,.0f} | {fmt_ms(c1['p50_ms'])} / {fmt_ms(c1['p95_ms'])} / "
            f"{fmt_ms(c1['p99_ms'])} | {c32['rps']:,.0f} | {fmt_ms(c32['p50_ms'])} / "
            f"{fmt_ms(c32['p95_ms'])} / {fmt_ms(c32['p99_ms'])} | "
            f"{c32['cpu_us_per_req']:.0f} µs | {errs:.0f} |"
        )
    lines.append("")
    for ours, floor, what in (
        ("lg-pass", "bare-proxy", "pass-through vs bare aiohttp proxy"),
        ("lg-hit", "dict", "exact hit vs aiohttp dict lookup"),
    ):
        if ours in med and floor in med:
            a, b = med[ours], med[floor]
            # per round too: the spread says how much of the ratio is the machine's noise
            per_round = [
                ratio(x["c32"]["rps"], y["c32"]["rps"])
                for x, y in zip(
                    next(r for r in done if r.key == ours).runs,
                    next(r for r in done if r.key == floor).runs,
                    strict=False,
                )
            ]
            lines.append(
                f"{what}: c32 {ratio(a['c32']['rps'], b['c32']['rps'])} (rounds: "
                f"{', '.join(per_round)}), c1 {ratio(a['c1']['rps'], b['c1']['rps'])}, "
                f"CPU/req {a['c32']['cpu_us_per_req']:.0f} vs {b['c32']['cpu_us_per_req']:.0f} µs "
                f"({ratio(b['c32']['cpu_us_per_req'], a['c32']['cpu_us_per_req'])})"
            )
    if "lg-semantic-miss" in med:
        sm = med["lg-semantic-miss"]
        hits = sm["c1"]["hits"] + sm["c32"]["hits"]
        lines.append(
            f"semantic miss: {sm['c32']['cpu_us_per_req']:.0f} µs CPU per request at c32 "
            f"(embedding batched), {hits:.0f} of the unique questions answered from the cache"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5, help="seconds per wrk run")
    ap.add_argument("--rounds", type=int, default=2, help="setups in turns this many times")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="py-spy flame graphs of latentgate's c32 runs in bench/results/ (perturbs them)",
    )
    ap.add_argument("--only", help="comma-separated row keys: " + ",".join(r.key for r in rows()))
    args = ap.parse_args()
    peers.require_tools("wrk", "nginx")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = Path(tempfile.mkdtemp(prefix="lg-hotpath-"))
    RESULTS.mkdir(exist_ok=True)
    todo = [r for r in rows() if not args.only or r.key in args.only.split(",")]
    starters: dict[str, Callable[[int], peers.Target]] = {
        "nginx-proxy": lambda up: peers.start_nginx_proxy(tmp, up),
        "bare": lambda up: peers.start_bare(tmp, up),
        "latentgate": lambda up: peers.start_latentgate_default(tmp, up),
        "nginx-cache": lambda up: peers.start_nginx_post_cache(tmp, up),
        "dict": lambda _: peers.start_dict_floor(tmp),
    }
    upstream = peers.start_nginx_upstream(tmp)
    targets: dict[str, peers.Target] = {}
    try:
        for r in todo:
            if r.target not in targets:
                targets[r.target] = starters[r.target](upstream.port)
        # each setup answers as it should: the hit rows from their caches, pass-through bypassing
        for r in todo:
            if not r.unique:
                print(
                    f"{r.label}: X-Cache {x_cache(targets[r.target].port, r.header)}",
                    file=sys.stderr,
                )
        for rnd in range(args.rounds):
            for r in todo:
                t0 = time.monotonic()
                svg = None
                if args.profile:
                    svg = RESULTS / f"hotpath-{r.key}-{time.strftime('%Y%m%d-%H%M%S')}.svg"
                r.runs.append(measure(r, targets[r.target], args.seconds, svg))
                print(
                    f"round {rnd + 1}/{args.rounds}: {r.label} "
                    f"{r.runs[-1]['c32']['rps']:,.0f} req/s at c32 "
                    f"({time.monotonic() - t0:.0f}s)",
                    file=sys.stderr,
                )
    finally:
        for t in targets.values():
            t.stop()
        upstream.stop()
    print(report(todo, args))
    path = RESULTS / f"hotpath-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"args": vars(args), "runs": {r.key: r.runs for r in todo}}))
    print(f"raw results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
