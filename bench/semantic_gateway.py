"""Semantic-hit latency end to end through the gateway: `python -m bench.semantic_gateway`.

The gateway runs as its own process (`python -m gateway serve`, one worker) with the default
config's chat-route semantic policy (config/latentgate.yaml), in front of the test upstream.
Seeds N first questions of QQP duplicate pairs (eval part), then asks their second questions one
at a time over one keep-alive HTTP/1.1 connection (http.client: a lean client, so the figure is
the gateway's, not the SDK's); prints p50/p95/p99 of semantic hits and of misses, and the
gateway's own semantic stage time from Server-Timing. `--verifier features|cross-encoder|off`
compares verifiers in one run.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bench.semantic_data import splits
from tests.conftest import base_config
from tests.support.servers import GatewayProcess, ServerThread
from tests.support.upstream import build_upstream

CONFIG = Path(__file__).resolve().parents[1] / "config" / "latentgate.yaml"


def default_policy() -> dict[str, Any]:
    doc = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    route = next(r for r in doc["routes"] if r["name"] == "openai-chat")
    return dict(route["cache"]["semantic"])


def ask(conn: http.client.HTTPConnection, text: str) -> tuple[float, str, float | None]:
    body = json.dumps(
        {"model": "m", "temperature": 0, "messages": [{"role": "user", "content": text}]}
    )
    t = time.perf_counter()
    conn.request(
        "POST",
        "/v1/chat/completions",
        body=body,
        headers={"Content-Type": "application/json", "Authorization": "Bearer sk-bench"},
    )
    resp = conn.getresponse()
    resp.read()
    ms = (time.perf_counter() - t) * 1000
    m = re.search(r"semantic;dur=([\d.]+)", resp.getheader("server-timing") or "")
    return ms, resp.getheader("x-cache") or "", float(m.group(1)) if m else None


def run(verifier: str, pairs: list[tuple[str, str]], upstream_url: str) -> dict[str, Any]:
    cfg = base_config(upstream_url)
    policy = default_policy()
    if verifier != "default":
        policy["verifier"] = verifier
    for r in cfg["routes"]:
        if r["name"] == "chat":
            r["cache"] = {
                "exact": {"enabled": True, "ttl": 600, "tiers": ["memory"]},
                "semantic": policy,
            }
    gw = GatewayProcess(cfg).start()
    conn = http.client.HTTPConnection("127.0.0.1", gw.port)
    try:
        for a, _ in pairs:
            ask(conn, a)
        hits: list[float] = []
        misses: list[float] = []
        stage: list[float] = []
        for _, b in pairs:
            ms, cache, st = ask(conn, b)
            if cache == "semantic-hit":
                hits.append(ms)
                if st is not None:
                    stage.append(st)
            else:
                misses.append(ms)
    finally:
        conn.close()
        gw.stop()
    out: dict[str, Any] = {"verifier": policy.get("verifier"), "threshold": policy["threshold"]}
    print(f"\nverifier {out['verifier']} (cosine floor {out['threshold']}):")
    for name, v in (
        ("semantic hit (client)", hits),
        ("miss (client, upstream included)", misses),
        ("semantic stage on hits (Server-Timing)", stage),
    ):
        if v:
            a = np.asarray(v)
            p50, p95, p99 = (float(np.percentile(a, q)) for q in (50, 95, 99))
            out[name] = {"n": len(v), "p50": p50, "p95": p95, "p99": p99}
            print(f"  {name:<40} n={len(v):<4} p50 {p50:.2f} ms  p95 {p95:.2f}  p99 {p99:.2f}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-n", type=int, default=300)
    ap.add_argument("--verifier", default="default,features", help="comma-separated")
    args = ap.parse_args()
    ps = splits()["qqp"]["eval"]
    pairs = [(ps.a[i], ps.b[i]) for i in range(len(ps)) if ps.label[i] == 1][: args.n]
    upstream = ServerThread(build_upstream).start()
    try:
        for v in args.verifier.split(","):
            run(v, pairs, upstream.url)
    finally:
        upstream.stop()


if __name__ == "__main__":
    main()
