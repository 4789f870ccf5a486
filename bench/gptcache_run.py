"""GPTCache, the peer, scored on the same pooled pairs: built in its own venv (it pins and
auto-installs its own dependencies) and run there by bench/gptcache_peer.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.semantic_data import CACHE_DIR, PairSet, model_path
from bench.semantic_pooled import Pool, build_pool, score

GPTCACHE_VENV = CACHE_DIR / "gptcache-venv"


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def ensure_gptcache_venv() -> None:
    """GPTCache in its own venv (it pins and auto-installs its own dependencies)."""
    py = GPTCACHE_VENV / "bin" / "python"
    if py.exists():
        return
    print(f"creating {GPTCACHE_VENV} (GPTCache 0.1.44, CPU torch)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(GPTCACHE_VENV)], check=True)
    pip = [str(py), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)
    subprocess.run(
        [*pip, "gptcache==0.1.44", "faiss-cpu", "sentence-transformers", "sqlalchemy"], check=True
    )


def gptcache_peer(ps: PairSet, pool: Pool, limit: int) -> dict[str, object] | None:
    py = GPTCACHE_VENV / "bin" / "python"
    try:
        ensure_gptcache_venv()
    except (OSError, subprocess.CalledProcessError) as exc:
        return {"error": f"could not build the GPTCache venv: {exc}"}
    n = min(limit, len(ps))
    sub = ps.subset(range(n))
    sub_pool = build_pool(
        sub, pool.entry_vecs[pool.own[:n]], np.zeros((n, pool.entry_vecs.shape[1]), np.float32)
    )
    job = {"model": model_path(), "entries": sub_pool.entries, "queries": sub.b}
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = Path(tmp) / "in.json", Path(tmp) / "out.json"
        inp.write_text(json.dumps(job), encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        proc = subprocess.run(
            [str(py), str(Path(__file__).with_name("gptcache_peer.py")), str(inp), str(out)],
            capture_output=True,
            text=True,
            env=env,
            timeout=1800,
        )
        if proc.returncode != 0:
            return {"error": proc.stderr.strip().splitlines()[-1:] or ["failed"]}
        res = json.loads(out.read_text(encoding="utf-8"))
    chosen = np.asarray(res["answers"], dtype=np.int64)
    s = score(sub_pool, chosen)
    lat = [x * 1000 for x in res["latency_s"]]
    return {
        "scores": s,
        "n": n,
        "p50_ms": pct(lat, 50),
        "p95_ms": pct(lat, 95),
        "p99_ms": pct(lat, 99),
    }
