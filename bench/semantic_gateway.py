"""Semantic-hit latency end to end through the gateway: `python -m bench.semantic_gateway`.

A real gateway (in-process thread, default semantic policy) in front of the test upstream.
Seeds N first questions of QQP duplicate pairs (eval part), then asks their second questions one
at a time with the openai SDK; prints p50/p95/p99 of semantic hits and of misses, and the
gateway's own semantic stage time from Server-Timing.
"""

from __future__ import annotations

import argparse
import re
import time

import numpy as np
import openai

from bench.semantic_data import splits
from gateway.app import build_app
from gateway.config import Settings
from tests.conftest import base_config
from tests.support.servers import ServerThread
from tests.support.upstream import build_upstream


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-n", type=int, default=300)
    args = ap.parse_args()
    ps = splits()["qqp"]["eval"]
    dup = [i for i in range(len(ps)) if ps.label[i] == 1][: args.n]
    upstream = ServerThread(build_upstream).start()
    cfg = base_config(upstream.url)
    for r in cfg["routes"]:
        if r["name"] == "chat":
            r["cache"] = {
                "exact": {"enabled": True, "ttl": 600, "tiers": ["memory"]},
                "semantic": {"enabled": True, "threshold": 0.85},
            }
    gw = ServerThread(lambda: build_app(Settings.model_validate(cfg))).start()
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="sk-bench", max_retries=0)
    try:
        for i in dup:
            client.chat.completions.create(
                model="m", temperature=0, messages=[{"role": "user", "content": ps.a[i]}]
            )
        hit_ms: list[float] = []
        miss_ms: list[float] = []
        stage_ms: list[float] = []
        for i in dup:
            t = time.perf_counter()
            raw = client.chat.completions.with_raw_response.create(
                model="m", temperature=0, messages=[{"role": "user", "content": ps.b[i]}]
            )
            ms = (time.perf_counter() - t) * 1000
            m = re.search(r"semantic;dur=([\d.]+)", raw.headers.get("server-timing", ""))
            if raw.headers.get("x-cache") == "semantic-hit":
                hit_ms.append(ms)
                if m:
                    stage_ms.append(float(m.group(1)))
            else:
                miss_ms.append(ms)
        for name, v in (
            ("semantic hit (client)", hit_ms),
            ("miss (client)", miss_ms),
            ("semantic stage on hits (Server-Timing)", stage_ms),
        ):
            if v:
                a = np.asarray(v)
                print(
                    f"{name:<40} n={len(v):<4} p50 {np.percentile(a, 50):.2f} ms  "
                    f"p95 {np.percentile(a, 95):.2f}  p99 {np.percentile(a, 99):.2f}"
                )
    finally:
        gw.stop()
        upstream.stop()


if __name__ == "__main__":
    main()
