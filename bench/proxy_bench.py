"""Pass-through benchmark: direct upstream vs nginx, a bare aiohttp proxy, LiteLLM and latentgate,
all in one run with the same load: wrk -t1 at 1 and 32 connections (req/s, p50/p95/p99) and an
open-loop 500 req/s run whose percentiles minus the direct upstream's are the ADDED latency.

Usage: .venv/bin/python bench/proxy_bench.py [--litellm] [--duration 10] [--rounds 1]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import peers

BODY = json.dumps(
    {
        "model": "m",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "Hello there, how are you today?"}],
    },
    separators=(",", ":"),
)
PATH = "/v1/chat/completions"
LUA = Path(__file__).with_name("post.lua")


def wrk(
    port: int,
    conns: int,
    seconds: float,
    *,
    body: str = BODY,
    header: str = "",
    unique: bool = False,
) -> dict[str, float]:
    """wrk -t1 POSTing `body` (or, with `unique`, a new deterministic chat question each time)
    with an optional extra `header` ("Name: value")."""
    out = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{conns}",
            f"-d{max(1, round(seconds))}s",
            "--timeout",
            "10s",
            "-s",
            str(LUA),
            f"http://127.0.0.1:{port}{PATH}",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={
            **os.environ,
            "BENCH_BODY": body,
            "BENCH_AUTH": peers.MASTER_KEY,
            "BENCH_HEADER": header,
            "BENCH_UNIQUE": "1" if unique else "",
        },
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    hits = next((int(x.split()[1]) for x in out.splitlines() if x.startswith("HITS ")), 0)
    n, dur_us, p50, p95, p99, status_err, sock_err = line.split()[1:]
    return {
        "rps": int(n) / (int(dur_us) / 1e6),
        "requests": int(n),
        "p50_ms": float(p50) / 1000,
        "p95_ms": float(p95) / 1000,
        "p99_ms": float(p99) / 1000,
        "errors": int(status_err) + int(sock_err),
        "hits": hits,
    }


def openloop(port: int, rate: float, seconds: float) -> dict[str, float]:
    out = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).with_name("openloop.py")),
            "127.0.0.1",
            str(port),
            PATH,
            "--rate",
            str(rate),
            "--duration",
            str(seconds),
            "--body",
            BODY,
            "--auth",
            peers.MASTER_KEY,
            "--connections",
            "64",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(json.loads(out))


def measure(
    target: peers.Target, args: argparse.Namespace, slow: bool
) -> dict[str, dict[str, float]]:
    # Warm up: first requests pay for imports, pools and JITs in some peers.
    for _ in range(20 if slow else 5):
        peers.post_once(target.port, BODY, peers.MASTER_KEY)
    wrk(target.port, 4, 10 if slow else 1)
    res = {"c1": wrk(target.port, 1, args.duration)}
    cpu0 = target.cpu_seconds()
    res["c32"] = wrk(target.port, 32, args.duration)
    # CPU per request is the figure that survives a noisy shared machine best.
    res["c32"]["cpu_us_per_req"] = (
        (target.cpu_seconds() - cpu0) / max(1, res["c32"]["requests"]) * 1e6
    )
    # A peer that cannot sustain the rate gets a short run: it is reported as saturated.
    res["open"] = openloop(target.port, args.rate, min(args.duration, 5) if slow else args.duration)
    return res


def median_runs(runs: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for phase in runs[0]:
        out[phase] = {k: statistics.median(r[phase][k] for r in runs) for k in runs[0][phase]}
    return out


def fmt_ms(x: float) -> str:
    return f"{x * 1000:.0f} µs" if abs(x) < 1 else f"{x:.2f} ms"


def table(results: dict[str, dict[str, dict[str, float]]], rate: float) -> str:
    direct = next(iter(results.values()))["open"]
    floor = next((v for k, v in results.items() if k.startswith("bare")), None)
    rows = [
        "| target | c1 req/s | c1 p50 / p95 / p99 | c32 req/s | c32 p50 / p95 / p99 | "
        f"c32 vs bare | CPU/req at c32 | {rate:.0f} req/s p50 / p99 | added p50 / p99 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        c1, c32, op = r["c1"], r["c32"], r["open"]
        ratio = f"{c32['rps'] / floor['c32']['rps']:.2f}×" if floor else "-"
        # `late`: requests that fell due while every generator connection was still busy
        # (a stall of tens of ms); they are not sent, so they are counted here, not hidden.
        late = f" ({op['late']:.0f} late)" if op["late"] else ""
        if op["achieved_rps"] < 0.95 * rate:
            added = f"saturated: {op['achieved_rps']:.0f} req/s done{late}"
        else:
            added = (
                f"{fmt_ms(op['p50_ms'] - direct['p50_ms'])} / "
                f"{fmt_ms(op['p99_ms'] - direct['p99_ms'])}{late}"
            )
        if r is next(iter(results.values())):
            added = "(baseline)"
        errs = c1["errors"] + c32["errors"] + op["errors"]
        rows.append(
            f"| {name}{f' ({errs:.0f} errors)' if errs else ''} | {c1['rps']:,.0f} | "
            f"{fmt_ms(c1['p50_ms'])} / {fmt_ms(c1['p95_ms'])} / {fmt_ms(c1['p99_ms'])} | "
            f"{c32['rps']:,.0f} | {fmt_ms(c32['p50_ms'])} / {fmt_ms(c32['p95_ms'])} / "
            f"{fmt_ms(c32['p99_ms'])} | {ratio} | {c32['cpu_us_per_req']:.0f} µs | "
            f"{fmt_ms(op['p50_ms'])} / {fmt_ms(op['p99_ms'])} | "
            f"{added} |"
        )
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--duration", type=float, default=10, help="seconds per wrk run and open-loop run"
    )
    ap.add_argument("--rounds", type=int, default=1, help="repeat everything; report medians")
    ap.add_argument("--rate", type=float, default=500, help="open-loop request rate")
    ap.add_argument("--litellm", action="store_true", help="include LiteLLM (installs it once)")
    ap.add_argument("--only", help="comma-separated subset: nginx,bare,litellm,latentgate")
    ap.add_argument(
        "--cache-dir",
        default=os.environ.get(
            "LATENTGATE_BENCH_CACHE", str(Path.home() / ".cache" / "latentgate-bench")
        ),
    )
    ap.add_argument("--render", metavar="JSON", help="print the table of a saved results file")
    args = ap.parse_args()
    peers.require_tools("wrk", "nginx")
    if args.render:
        saved = json.loads(Path(args.render).read_text())
        print(table(saved["medians"], saved["args"]["rate"]))
        return 0
    # SIGTERM (and SIGINT, which background shells ignore) unwinds through `finally`: no peer
    # process is left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = Path(tempfile.mkdtemp(prefix="lg-bench-"))
    cache = Path(args.cache_dir)
    starters: list[tuple[str, Callable[[int], peers.Target], bool]] = [
        ("nginx", lambda up: peers.start_nginx_proxy(tmp, up), False),
        ("bare", lambda up: peers.start_bare(tmp, up), False),
        ("litellm", lambda up: peers.start_litellm(tmp, up, cache), True),
        ("latentgate", lambda up: peers.start_latentgate(tmp, up), False),
    ]
    wanted = set(args.only.split(",")) if args.only else {"nginx", "bare", "latentgate"}
    if args.litellm:
        wanted.add("litellm")
    if "litellm" in wanted:
        peers.litellm_venv(cache)  # install before the clock starts
    upstream = peers.start_nginx_upstream(tmp)
    runs: dict[str, list[dict[str, dict[str, float]]]] = {}
    try:
        for rnd in range(args.rounds):
            print(f"round {rnd + 1}/{args.rounds}: direct upstream", file=sys.stderr)
            runs.setdefault(upstream.name, []).append(measure(upstream, args, slow=False))
            for key, start, slow in starters:
                if key not in wanted:
                    continue
                t0 = time.monotonic()
                target = start(upstream.port)
                print(
                    f"round {rnd + 1}/{args.rounds}: {target.name} (up in "
                    f"{time.monotonic() - t0:.1f}s)",
                    file=sys.stderr,
                )
                try:
                    runs.setdefault(target.name, []).append(measure(target, args, slow))
                finally:
                    target.stop()
    finally:
        upstream.stop()
    results = {name: median_runs(r) for name, r in runs.items()}
    direct = results[upstream.name]["open"]
    print(
        f"\nproxy pass-through, POST {PATH} ({len(BODY)}-byte body), wrk -t1, "
        f"{args.duration:.0f}s per run, {args.rounds} round(s) (medians); "
        f"{datetime.date.today()}, {os.cpu_count()} CPUs"
    )
    print(table(results, args.rate))
    print(
        f"\nopen-loop generator: {direct['generator_cpu_us_per_req']:.0f} µs CPU per request, "
        f"send lag p50 {fmt_ms(direct['send_lag_p50_ms'])} / "
        f"p99 {fmt_ms(direct['send_lag_p99_ms'])}"
        f"; direct-upstream latency through it (p50/p99) {fmt_ms(direct['p50_ms'])} / "
        f"{fmt_ms(direct['p99_ms'])} is the generator's own round trip."
    )
    out_dir = Path(__file__).with_name("results")
    out_dir.mkdir(exist_ok=True)
    out = out_dir / f"proxy-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"args": vars(args), "runs": runs, "medians": results}, indent=1))
    print(f"raw results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
