"""Semantic-hit latency end to end through the gateway: `python -m bench.semantic_gateway`.

The gateway runs as its own process (`python -m gateway serve`, one worker) with the default
config's chat-route semantic policy (config/latentgate.yaml), in front of the test upstream.
Seeds N first questions of QQP duplicate pairs (eval part), then asks their second questions one
at a time over one keep-alive HTTP/1.1 connection per gateway (http.client: a lean client, so
the figure is the gateway's, not the SDK's). Prints p50/p95/p99 of semantic hits and of misses,
and the gateway's own semantic stage time from Server-Timing.

`--verifier features|cross-encoder|off` and `--graphs fused,portable` (the embedder as ONNX
Runtime's fused graph, the default, or as the portable export) compare setups in one run: each
setup is a live gateway process and the questions go to them in turns of BLOCK, so the shared
VM's drift lands on all of them alike.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bench.semantic_data import splits
from tests.conftest import base_config
from tests.support.servers import GatewayProcess, ServerThread
from tests.support.upstream import build_upstream

MODEL = "builtin:all-MiniLM-L6-v2"
BLOCK = 50


def portable_artifacts(tmp: Path) -> str:
    """An artifacts dir that serves the portable export: the same file (linked), fusion marked
    as skipped, so the resolver neither fuses nor exports."""
    from backends.local.artifacts import resolve

    art = resolve(MODEL, None)
    dst = tmp / art.onnx_path.parent.name
    dst.mkdir(parents=True)
    try:
        (dst / art.onnx_path.name).hardlink_to(art.onnx_path)
    except OSError:
        shutil.copy(art.onnx_path, dst / art.onnx_path.name)
    (dst / "model.fp32.fused.skipped").write_text("bench: the portable graph, for comparison")
    return str(tmp)


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


@dataclass
class Setup:
    verifier: str
    graph: str
    gw: GatewayProcess
    conn: http.client.HTTPConnection
    hits: list[float] = field(default_factory=list)
    misses: list[float] = field(default_factory=list)
    stage: list[float] = field(default_factory=list)


def start(verifier: str, graph: str, upstream_url: str, artifacts: str | None) -> Setup:
    cfg = base_config(upstream_url)
    if artifacts is not None:
        cfg.setdefault("cache", {}).setdefault("semantic", {})["artifacts_dir"] = artifacts
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
    floor = policy.get("threshold", "default")  # default: the artifact's point, or 0.90 if off
    name = f"verifier {policy.get('verifier')} (cosine floor {floor}), {graph} graph"
    return Setup(name, graph, gw, http.client.HTTPConnection("127.0.0.1", gw.port))


def measure(setups: list[Setup], pairs: list[tuple[str, str]]) -> None:
    """Turns of BLOCK questions per gateway rather than one each: ONNX Runtime's worker threads
    spin for a while after a run, and one gateway's spinning must not tax the next one's run."""
    for s in setups:
        for a, _ in pairs:
            ask(s.conn, a)
    for lo in range(0, len(pairs), BLOCK):
        for s in setups:
            for _, b in pairs[lo : lo + BLOCK]:
                ms, cache, st = ask(s.conn, b)
                if cache == "semantic-hit":
                    s.hits.append(ms)
                    if st is not None:
                        s.stage.append(st)
                else:
                    s.misses.append(ms)


def report(s: Setup) -> dict[str, Any]:
    out: dict[str, Any] = {"setup": s.verifier}
    print(f"\n{s.verifier}:")
    for name, v in (
        ("semantic hit (client)", s.hits),
        ("miss (client, upstream included)", s.misses),
        ("semantic stage on hits (Server-Timing)", s.stage),
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
    ap.add_argument("--graphs", default="fused", help="comma-separated: fused, portable")
    args = ap.parse_args()
    ps = splits()["qqp"]["eval"]
    pairs = [(ps.a[i], ps.b[i]) for i in range(len(ps)) if ps.label[i] == 1][: args.n]
    upstream = ServerThread(build_upstream).start()
    tmp = Path(tempfile.mkdtemp(prefix="lg-portable-"))
    setups: list[Setup] = []
    try:
        portable = portable_artifacts(tmp) if "portable" in args.graphs else None
        for v in args.verifier.split(","):
            for g in args.graphs.split(","):
                setups.append(start(v, g, upstream.url, portable if g == "portable" else None))
        measure(setups, pairs)
        for s in setups:
            report(s)
    finally:
        for s in setups:
            s.conn.close()
            s.gw.stop()
        upstream.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
