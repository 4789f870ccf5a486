"""The semantic error budget through a real gateway: `python -m bench.semantic_budget`.

A stand-in upstream answers every question by its class: labelled duplicates (joined through
every labelled edge, as the labelled protocol does) share one answer, every other text has its
own. So a semantic hit is right exactly when it returns the asker's class answer, and the
gateway's own labels (exact match of the answer text) see the same truth a user would.

One gateway process (`python -m gateway serve`), four routes on /v1/chat/completions told apart
by model: `static` (the shipped point, no budget) and `budget-0.02`, `budget-0.05`,
`budget-0.10` (cache.semantic.max_error_rate). Each stream sends all first texts, then all
second texts, one at a time, to every route in turn. Streams: QQP (eval part), PAWS (eval part),
STS-B dev, and banking77 / clinc150 (intent = class, clinc's out-of-scope texts each their own;
first half of the stream, then second half). Reports, per route: error and hit rate of semantic
hits in the second half, audit calls (upstream calls beyond the misses), a learning curve per
500 requests, semantic-hit latency (client) p50/p95/p99 and throughput.

`--part calib` replays the calib parts instead (for tuning; the eval parts are the report).
`--fleet N` runs N gateway processes on one Redis (exact tier memory then Redis, shared index,
budget counts and tenant labels) and sends each route's requests to them in turn: whether the
budget a fleet learns together holds as it does in one process.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.semantic_data import load_qqp, load_streams, splits
from bench.semantic_gateway import default_policy
from bench.semantic_pooled import label_roots
from tests.conftest import base_config
from tests.support.class_upstream import CALLS, build_class_upstream, class_answer
from tests.support.servers import GatewayProcess, RedisServer, ServerThread

BUDGETS = (0.02, 0.05, 0.10)
CURVE = 500
ADMIN = "bench-admin"


@dataclass
class Stream:
    name: str
    first: list[str]
    second: list[str]
    classes: dict[str, str]

    def answers(self) -> dict[str, str]:
        return {t: class_answer(c) for t, c in self.classes.items()}


def pair_streams(part: str, dev_roots: bool = False) -> list[Stream]:
    """Classes from the streamed pairs' own labels (as a held-out stream has them); dev_roots:
    QQP's from every labelled edge of the 40,000 dev pairs, which joins more questions."""
    data = splits()
    qroots = label_roots(load_qqp()) if dev_roots else None
    out = []
    for d in ("qqp", "paws", "stsb"):
        ps = data[d][part]
        roots = qroots if d == "qqp" and qroots is not None else label_roots(ps)
        texts = ps.a + ps.b
        out.append(
            Stream(f"{d} {part}", ps.a, ps.b, {t: roots.get(t.lower(), t.lower()) for t in texts})
        )
    return out


def intent_streams(limit: int) -> list[Stream]:
    out = []
    for st in load_streams(limit):
        if st.labels is None:
            continue  # bing-covid has no ground truth
        classes = {
            t: (f"{lab}:{t}" if lab in st.wrong_labels else lab)
            for t, lab in zip(st.texts, st.labels, strict=True)
        }
        half = len(st.texts) // 2
        out.append(Stream(st.name, st.texts[:half], st.texts[half:], classes))
    return out


@dataclass
class RouteRun:
    model: str
    conns: list[http.client.HTTPConnection]  # one per gateway: requests go to them in turn
    log: list[tuple[str, int]] = field(default_factory=list)  # (x-cache, wrong)
    hit_ms: list[float] = field(default_factory=list)
    hit_stage_ms: list[float] = field(default_factory=list)  # the gateway's semantic stage


def routes_config(upstream: str) -> dict[str, Any]:
    cfg = base_config(upstream)
    policy = default_policy()
    chat = next(r for r in cfg["routes"] if r["name"] == "chat")
    routes = []
    for name in ("static", *(f"budget-{b:.2f}" for b in BUDGETS)):
        sem = dict(policy)
        if name != "static":
            sem["max_error_rate"] = float(name.split("-")[1])
        r = {**chat, "name": name, "match": {**chat["match"], "model": name}}
        r["cache"] = {"exact": {"enabled": True, "ttl": 3600, "tiers": ["memory"]}, "semantic": sem}
        routes.append(r)
    cfg["routes"] = routes + [r for r in cfg["routes"] if r["name"] != "chat"]
    cfg["admin"] = {"token": ADMIN}
    cfg.setdefault("cache", {})["memory"] = {"max_bytes": 512 << 20}
    return cfg


def ask(run: RouteRun, text: str, expected: str) -> None:
    body = json.dumps(
        {"model": run.model, "temperature": 0, "messages": [{"role": "user", "content": text}]}
    )
    conn = run.conns[len(run.log) % len(run.conns)]
    t = time.perf_counter()
    conn.request(
        "POST",
        "/v1/chat/completions",
        body=body,
        headers={"Content-Type": "application/json", "Authorization": "Bearer sk-bench"},
    )
    resp = conn.getresponse()
    raw = resp.read()
    ms = (time.perf_counter() - t) * 1000
    cache = resp.getheader("x-cache") or ""
    content = json.loads(raw)["choices"][0]["message"]["content"]
    run.log.append((cache, int(content != expected)))
    if cache == "semantic-hit":
        run.hit_ms.append(ms)
        m = re.search(r"semantic;dur=([\d.]+)", resp.getheader("server-timing") or "")
        if m:
            run.hit_stage_ms.append(float(m.group(1)))


def admin(port: int) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    conn.request("GET", "/admin/semantic", headers={"Authorization": f"Bearer {ADMIN}"})
    doc: dict[str, Any] = json.loads(conn.getresponse().read())
    conn.close()
    return doc


def fleet_config(cfg: dict[str, Any], redis_url: str) -> dict[str, Any]:
    """What a fleet of sidecars on one Redis is configured with: Redis behind each memory."""
    cfg["cache"]["redis"] = {"url": redis_url, "key_prefix": "bench:"}
    cfg["cache"]["tenant_secret"] = "bench-fleet-shared-tenant-secret"
    for r in cfg["routes"]:
        exact = r.get("cache", {}).get("exact")
        if exact and exact.get("tiers") == ["memory"]:
            exact["tiers"] = ["memory", "redis"]
    return cfg


def run_stream(stream: Stream, fleet: int = 1) -> dict[str, Any]:
    answers = stream.answers()
    upstream = ServerThread(lambda: build_class_upstream(answers)).start()
    cfg = routes_config(upstream.url)
    redis = RedisServer().start() if fleet > 1 else None
    if redis is not None:
        cfg = fleet_config(cfg, redis.url)
    gws = [GatewayProcess(cfg).start() for _ in range(fleet)]
    runs = [
        RouteRun(m, [http.client.HTTPConnection("127.0.0.1", g.port) for g in gws])
        for m in ("static", *(f"budget-{b:.2f}" for b in BUDGETS))
    ]
    texts = stream.first + stream.second

    def replay(r: RouteRun) -> None:
        for text in texts:
            ask(r, text, answers.get(text) or class_answer("text:" + text))

    t0 = time.perf_counter()
    try:
        # The routes are independent (own namespace, own budget): one client thread each, so
        # the gateway's embedder batches across them; within a route the order is the stream's.
        with ThreadPoolExecutor(len(runs)) as pool:
            list(pool.map(replay, runs))
        took = time.perf_counter() - t0
        time.sleep(1.0)  # the last background labels
        state = admin(gws[0].port)
        assert upstream.app is not None
        counted: Counter[str] = upstream.app[CALLS]
        calls = dict(counted)
    finally:
        for r in runs:
            for c in r.conns:
                c.close()
        for g in gws:
            g.stop()
        upstream.stop()
        if redis is not None:
            redis.stop()
    half = len(stream.first)
    print(
        f"\n{stream.name}: {len(texts)} requests per route ({half} first texts, then "
        f"{len(stream.second)} second), {len(texts) * len(runs) / took:.0f} req/s overall"
        + (f", {fleet} gateways on one Redis" if fleet > 1 else "")
    )
    out: dict[str, Any] = {"requests": len(texts)}
    for r in runs:
        out[r.model] = summarise(r, half, calls.get(r.model, 0), state["routes"].get(r.model, {}))
    return out


def summarise(r: RouteRun, half: int, upstream_calls: int, state: dict[str, Any]) -> dict[str, Any]:
    second = r.log[half:]
    hits = [w for c, w in second if c == "semantic-hit"]
    all_hits = sum(1 for c, _ in r.log if c == "semantic-hit")
    misses = sum(1 for c, _ in r.log if c == "miss")
    audits = upstream_calls - misses
    err = sum(hits) / len(hits) if hits else float("nan")
    curve = []
    for lo in range(0, len(r.log), CURVE):
        chunk = r.log[lo : lo + CURVE]
        h = [w for c, w in chunk if c == "semantic-hit"]
        curve.append((len(h) / len(chunk), sum(h) / len(h) if h else float("nan")))
    lat = np.asarray(r.hit_ms) if r.hit_ms else np.asarray([float("nan")])
    p50, p95, p99 = (float(np.percentile(lat, q)) for q in (50, 95, 99))
    stage = np.asarray(r.hit_stage_ms) if r.hit_stage_ms else np.asarray([float("nan")])
    s50 = float(np.percentile(stage, 50))
    bar = state.get("budget", {}).get("bar")
    print(
        f"  {r.model:<12} 2nd half: hits {len(hits):>4} ({len(hits) / max(len(second), 1):.3f})"
        f" error {err:.3f} | all hits {all_hits}, audit calls {audits}"
        f" ({audits / max(all_hits, 1):.1%} of hits) | hit p50 {p50:.2f} ms p95 {p95:.2f}"
        f" p99 {p99:.2f} (stage p50 {s50:.2f}) | final bar {bar}"
    )
    print(
        "               per 500: "
        + " ".join(f"{h:.2f}/{e:.2f}" if e == e else f"{h:.2f}/-" for h, e in curve)
        + "  (hit rate/error)"
    )
    return {
        "second_half_hits": len(hits),
        "second_half_hit_rate": len(hits) / max(len(second), 1),
        "second_half_error": err,
        "hits": all_hits,
        "audit_calls": audits,
        "curve": curve,
        "hit_ms": {"p50": p50, "p95": p95, "p99": p99},
        "hit_stage_ms_p50": s50,
        "state": state,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--part", default="eval", help="eval (the report) or calib (tuning)")
    ap.add_argument("--streams", default="qqp,paws,stsb,banking77,clinc150")
    ap.add_argument("--intent-limit", type=int, default=2000)
    ap.add_argument(
        "--roots",
        choices=("part", "dev"),
        default="part",
        help="answer classes from the streamed pairs' own labels, or QQP's whole dev graph",
    )
    ap.add_argument("--json", default=None)
    ap.add_argument("--fleet", type=int, default=1, help="gateway processes on one Redis")
    args = ap.parse_args()
    want = set(args.streams.split(","))
    streams = [s for s in pair_streams(args.part, args.roots == "dev") if s.name.split()[0] in want]
    streams += [s for s in intent_streams(args.intent_limit) if s.name in want]
    res = {s.name: run_stream(s, args.fleet) for s in streams}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(res, fh, indent=1, default=float)


if __name__ == "__main__":
    main()
