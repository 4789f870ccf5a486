"""Two tenants on one budgeted route: `python -m bench.semantic_tenants`.

The error budget is learned per route, from every tenant's labels. This measures what each
tenant gets when their traffic differs: tenant `qqp` asks question-like traffic (the QQP eval
part), tenant `hard` asks loosely related sentences (STS-B dev, where the shipped static point
serves ~28 % wrong). Their streams are interleaved (each all first texts, then all second texts,
merged by their position in their own stream) and replayed, one request at a time, to three
routes of one gateway process told apart by model: `static` (the shipped point), `pooled`
(max_error_rate 0.10, `tenant_guard: false`: every tenant at the route's bar) and `guarded`
(0.10, the default: a tenant whose own labels refute the bar is served nothing semantic).

`--hard verbatim` gives tenant `hard` question-like traffic whose answers depend on the exact
wording (the QQP calib part's questions, each answered as its own class, as a code or SQL
generator's would be): every semantic hit it gets is wrong, and only its own labels can say so.

The stand-in upstream answers by class (bench.semantic_budget): a hit is right exactly when it
returns the asker's class answer. Reports per route and tenant: semantic hits and their error
in the tenant's second half, audit calls, hit p50/p95/p99 and throughput, and /admin/semantic's
guarded tenants. One command, one run, side by side.

`--fleet N` runs N gateway processes on one Redis (shared index, counts and tenant labels) and
sends each route's requests to them in turn: what a fleet of sidecars serves each tenant, and
how many of the hard tenant's hits it serves before every sidecar keeps that tenant apart.
"""

from __future__ import annotations

import argparse
import http.client
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.semantic_budget import Stream, admin, fleet_config, pair_streams, routes_config
from tests.support.class_upstream import CALLS, build_class_upstream, class_answer
from tests.support.servers import GatewayProcess, RedisServer, ServerThread

ROUTES = ("static", "pooled", "guarded")
TENANTS = {"qqp": "sk-tenant-qqp", "hard": "sk-tenant-hard"}


@dataclass
class Ask:
    tenant: str
    text: str
    second_half: bool  # in the second half of its tenant's own stream


@dataclass
class Run:
    model: str
    conns: list[http.client.HTTPConnection]  # one per gateway: requests go to them in turn
    log: list[tuple[str, bool, str, int]] = field(default_factory=list)  # tenant, 2nd, cache, wrong
    hit_ms: list[float] = field(default_factory=list)


def merged(streams: dict[str, Stream]) -> list[Ask]:
    """Each tenant's stream in its own order, interleaved by the fraction of it already sent."""
    out: list[tuple[float, int, Ask]] = []
    for k, (tenant, s) in enumerate(streams.items()):
        texts = s.first + s.second
        for i, t in enumerate(texts):
            out.append((i / len(texts), k, Ask(tenant, t, i >= len(s.first))))
    return [a for _, _, a in sorted(out, key=lambda x: (x[0], x[1]))]


def config(upstream: str) -> dict[str, Any]:
    cfg = routes_config(upstream)
    by_name = {r["name"]: r for r in cfg["routes"]}
    static, budget = by_name["static"], by_name["budget-0.10"]
    routes = [static]
    for name, guard in (("pooled", False), ("guarded", True)):
        r = json.loads(json.dumps(budget))
        r["name"], r["match"]["model"] = name, name
        r["cache"]["semantic"]["tenant_guard"] = guard
        routes.append(r)
    cfg["routes"] = routes + [
        r for r in cfg["routes"] if not r["name"].startswith(("static", "budget"))
    ]
    return cfg


def ask(run: Run, a: Ask, expected: str) -> None:
    body = json.dumps(
        {"model": run.model, "temperature": 0, "messages": [{"role": "user", "content": a.text}]}
    )
    conn = run.conns[len(run.log) % len(run.conns)]
    t = time.perf_counter()
    conn.request(
        "POST",
        "/v1/chat/completions",
        body=body,
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {TENANTS[a.tenant]}",
        },
    )
    resp = conn.getresponse()
    raw = resp.read()
    ms = (time.perf_counter() - t) * 1000
    cache = resp.getheader("x-cache") or ""
    content = json.loads(raw)["choices"][0]["message"]["content"]
    run.log.append((a.tenant, a.second_half, cache, int(content != expected)))
    if cache == "semantic-hit":
        run.hit_ms.append(ms)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--part", default="eval", help="eval (the report) or calib (tuning)")
    ap.add_argument("--hard", choices=("stsb", "verbatim"), default="stsb")
    ap.add_argument("--json", default=None)
    ap.add_argument("--fleet", type=int, default=1, help="gateway processes on one Redis")
    args = ap.parse_args()
    pairs = {s.name.split()[0]: s for s in pair_streams(args.part)}
    hard = pairs["stsb"]
    if args.hard == "verbatim":
        q = next(s for s in pair_streams("calib") if s.name.startswith("qqp"))
        hard = Stream("qqp calib, verbatim", q.first, q.second, {t: t for t in q.first + q.second})
    streams = {"qqp": pairs["qqp"], "hard": hard}
    answers: dict[str, str] = {}
    for tenant, s in streams.items():  # a text in both streams keeps its first class
        for t, c in s.classes.items():
            answers.setdefault(t, class_answer(f"{tenant}:{c}"))
    asks = merged(streams)
    upstream = ServerThread(lambda: build_class_upstream(answers)).start()
    cfg = config(upstream.url)
    redis = None
    if args.fleet > 1:
        redis = RedisServer().start()
        cfg = fleet_config(cfg, redis.url)
    gws = [GatewayProcess(cfg).start() for _ in range(args.fleet)]
    runs = [Run(m, [http.client.HTTPConnection("127.0.0.1", g.port) for g in gws]) for m in ROUTES]

    def replay(r: Run) -> None:
        for a in asks:
            ask(r, a, answers.get(a.text) or class_answer("text:" + a.text))

    t0 = time.perf_counter()
    try:
        with ThreadPoolExecutor(len(runs)) as pool:
            list(pool.map(replay, runs))
        took = time.perf_counter() - t0
        time.sleep(1.0)  # the last background labels
        states = [admin(g.port)["routes"] for g in gws]
        state = states[0]
        assert upstream.app is not None
        calls = dict(upstream.app[CALLS])
    finally:
        for r in runs:
            for c in r.conns:
                c.close()
        for g in gws:
            g.stop()
        upstream.stop()
        if redis is not None:
            redis.stop()
    sizes = {t: len(s.first) + len(s.second) for t, s in streams.items()}
    print(
        f"two tenants on one route: qqp {sizes['qqp']} requests ({streams['qqp'].name}), "
        f"hard {sizes['hard']} ({streams['hard'].name}), interleaved; "
        f"{len(asks) * len(runs) / took:.0f} req/s over {len(runs)} routes"
        + (f", {args.fleet} gateways on one Redis" if args.fleet > 1 else "")
    )
    out: dict[str, Any] = {}
    for r in runs:
        misses = sum(1 for _, _, c, _ in r.log if c == "miss")
        hits_all = sum(1 for _, _, c, _ in r.log if c == "semantic-hit")
        audits = calls.get(r.model, 0) - misses
        lat = np.asarray(r.hit_ms) if r.hit_ms else np.asarray([float("nan")])
        p50, p95, p99 = (float(np.percentile(lat, q)) for q in (50, 95, 99))
        budget = state.get(r.model, {}).get("budget", {})
        row: dict[str, Any] = {"audit_calls": audits, "hits": hits_all}
        line = f"  {r.model:<8}"
        for tenant in streams:
            second = [(c, w) for t, s2, c, w in r.log if t == tenant and s2]
            hits = [w for c, w in second if c == "semantic-hit"]
            err = sum(hits) / len(hits) if hits else float("nan")
            row[tenant] = {"second_half_hits": len(hits), "second_half_error": err}
            line += f" | {tenant}: 2nd-half hits {len(hits):>4} error {err:.3f}"
        guarded = budget.get("guarded_tenants", [])
        row["guarded_tenants"] = guarded
        every = [
            len(st.get(r.model, {}).get("budget", {}).get("guarded_tenants", [])) for st in states
        ]
        row["guarded_per_gateway"] = every
        row["hard_hits_all"] = sum(1 for t, _, c, _ in r.log if t == "hard" and c == "semantic-hit")
        row["hit_ms"] = {"p50": p50, "p95": p95, "p99": p99}
        line += (
            f" | audits {audits} ({audits / max(hits_all, 1):.1%} of hits)"
            f" | hit p50 {p50:.2f} ms p95 {p95:.2f} p99 {p99:.2f}"
            f" | bar {budget.get('bar', {}).get('open', '-')}, guarded tenants {len(guarded)}"
            f" | hard: hits in all {row['hard_hits_all']}"
            + (f", guarded per gateway {every}" if len(states) > 1 else "")
        )
        print(line)
        out[r.model] = row
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1, default=float)


if __name__ == "__main__":
    main()
