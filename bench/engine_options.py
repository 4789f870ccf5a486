"""One-sentence MiniLM embeds on ONNX Runtime: graph (fused/portable) x thread spinning, in-process.

    LATENTGATE_BENCH_FULL=1 .venv/bin/python -m bench.engine_options [--threads 2] [--gap-ms 2]

What a lone semantic lookup pays for its embedding, under each engine option, measured side by
side: every setup is a live session and the questions (QQP eval part) go to them in turns of
BLOCK calls, so the shared VM's drift lands on all of them alike. Between calls the loop sleeps
`--gap-ms` (requests arrive with gaps, as at a sidecar), which is when spinning threads burn CPU.
Prints p50/p95/p99 per call, calls/s of engine time, and the process CPU time per call.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from backends.local.artifacts import resolve
from backends.preprocess.cpu import TextPreprocessor, pad_tokens
from bench.semantic_data import splits

BLOCK = 50


@dataclass
class Setup:
    name: str
    session: Any
    ms: list[float] = field(default_factory=list)
    cpu_s: float = 0.0


def session(path: str, threads: int, spin: bool) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gap-ms", type=float, default=2.0)
    ap.add_argument("-n", type=int, default=600, help="questions per setup")
    args = ap.parse_args()
    art = resolve("builtin:all-MiniLM-L6-v2", None)
    if art.fused_path is None:
        raise SystemExit("no fused graph here (see the warning above): nothing to compare")
    assert art.tokenizer_path is not None
    pre = TextPreprocessor.from_file(str(art.tokenizer_path), 256, True)
    feeds = [pad_tokens(pre.tokenize([q])) for q in splits()["qqp"]["eval"].b[: args.n]]
    graphs = (("fused", art.fused_path), ("portable", art.onnx_path))
    setups = [
        Setup(f"{g}, spinning {'on' if spin else 'off'}", session(str(p), args.threads, spin))
        for g, p in graphs
        for spin in (True, False)
    ]
    for s in setups:  # warm-up
        for f in feeds[:20]:
            s.session.run(None, f)
    for lo in range(0, len(feeds), BLOCK):
        for s in setups:
            c0 = time.process_time()
            for f in feeds[lo : lo + BLOCK]:
                t = time.perf_counter()
                s.session.run(None, f)
                s.ms.append((time.perf_counter() - t) * 1000)
                time.sleep(args.gap_ms / 1000)
            s.cpu_s += time.process_time() - c0
    print(f"{len(feeds)} QQP questions, {args.threads} intra-op threads, {args.gap_ms} ms gaps")
    print(f"{'setup':<26} {'p50':>7} {'p95':>7} {'p99':>7} {'calls/s':>8} {'CPU ms/call':>12}")
    for s in setups:
        p50, p95, p99 = (float(np.percentile(s.ms, q)) for q in (50, 95, 99))
        rate = len(s.ms) / (sum(s.ms) / 1000)
        cpu = s.cpu_s / len(s.ms) * 1000
        print(f"{s.name:<26} {p50:7.2f} {p95:7.2f} {p99:7.2f} {rate:8.0f} {cpu:12.2f}")


if __name__ == "__main__":
    main()
