"""`latentgate build`: export, lower precision, measure against FP32, promote only within a bound.

FP16 converts the ONNX graph (inputs/outputs stay FP32); INT8 is ONNX Runtime quantisation:
static with a calibration set, dynamic without. Embedders are measured by mean cosine to the FP32
embeddings, classifiers by top-1 agreement (build_classifier.py); a candidate under its bound is
kept aside and not promoted.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from backends.errors import EngineError
from backends.local.artifacts import ModelArtifact, promoted_path, resolve
from backends.local.build_classifier import agreement, detect_task, logits_runner, model_outputs
from backends.local.onnx import OrtEngine
from backends.local.sentences import read_sentences
from backends.local.stamps import write_stamp
from backends.local.text_encoder import TextEncoder
from backends.preprocess.cpu import TextPreprocessor, pad_tokens
from backends.settings import BatcherSettings

# The development checkout's STS-B dev sentences (read at run time, never shipped); elsewhere
# pass --validation FILE (plain text, one sentence per line, or an STS-B .csv).
DEFAULT_VALIDATION = "/work/shared/data/stsb/sts-dev.csv"


def progress(label: str, done: int, total: int, width: int = 30) -> None:
    filled = int(width * done / max(total, 1))
    end = "\n" if done >= total else ""
    bar = "#" * filled + "." * (width - filled)
    print(f"\r{label:<28} [{bar}] {done}/{total}", end=end, file=sys.stderr, flush=True)


@dataclass
class Measured:
    precision: str
    path: Path
    vectors: NDArray[np.float32]  # embeddings (embedders) or logits (classifiers)
    seconds: float


def _encoder(path: Path, art: ModelArtifact) -> TextEncoder:
    assert art.tokenizer_path is not None
    engine = OrtEngine(str(path), art.name, ["CPUExecutionProvider"])
    pre = TextPreprocessor.from_file(str(art.tokenizer_path), art.max_tokens or 512, True)
    return TextEncoder(art.name, engine, pre, BatcherSettings())


def measure(
    path: Path, art: ModelArtifact, precision: str, texts: list[str], logits: str | None = None
) -> Measured:
    """Embeddings, or the `logits` output of a classifier, for every text; timed after warm-up."""
    run = logits_runner(path, art, logits) if logits else _encoder(path, art).encode
    run(texts[:8])  # warm-up outside the timing
    rows, t0 = [], time.perf_counter()
    for i in range(0, len(texts), 32):
        rows.append(run(texts[i : i + 32]))
        progress(f"encode {precision}", min(i + 32, len(texts)), len(texts))
    return Measured(precision, path, np.concatenate(rows), time.perf_counter() - t0)


def _calibration_reader(art: ModelArtifact, texts: list[str]) -> Any:
    from onnxruntime.quantization import CalibrationDataReader

    assert art.tokenizer_path is not None
    pre = TextPreprocessor.from_file(str(art.tokenizer_path), art.max_tokens or 512, True)
    graph = OrtEngine(str(art.onnx_path), art.name, ["CPUExecutionProvider"])
    names = {i.name for i in graph.inputs}
    graph.close()

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            # Only the inputs the graph has: a classifier may take no token_type_ids.
            self._it: Iterator[dict[str, NDArray[np.int64]]] = (
                {k: v for k, v in pad_tokens(pre.tokenize(texts[i : i + 16])).items() if k in names}
                for i in range(0, len(texts), 16)
            )

        def get_next(self) -> dict[str, NDArray[np.int64]] | None:
            return next(self._it, None)

    return Reader()


def lower(art: ModelArtifact, precision: str, calibration: list[str] | None) -> Path:
    """Write the candidate ONNX file for `precision` next to the FP32 file."""
    out = promoted_path(art.onnx_path, precision).with_suffix(".candidate.onnx")
    if precision == "fp16":
        import onnx
        from onnxruntime.transformers.float16 import convert_float_to_float16

        model = convert_float_to_float16(onnx.load(str(art.onnx_path)), keep_io_types=True)
        onnx.save(model, str(out))
    elif precision == "int8" and calibration:
        from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

        quantize_static(str(art.onnx_path), str(out), _calibration_reader(art, calibration),
                        quant_format=QuantFormat.QDQ, weight_type=QuantType.QInt8)  # fmt: skip
    elif precision == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(str(art.onnx_path), str(out), weight_type=QuantType.QInt8)
    return out


def run_build(
    model: str,
    precision: str,
    *,
    calibration: str | None = None,
    validation: str | None = None,
    min_cosine: float = 0.999,
    min_agreement: float = 0.99,
    tokenizer: str | None = None,
    task: str = "auto",
    artifacts_dir: str | None = None,
    emit: Callable[[str], None] = print,
) -> int:
    """0: built and promoted; 1: refused (loss over the bound) or failed.

    task: "auto" (from the model's outputs), "embedder" or "classifier".
    """
    try:
        steps = 4
        progress("export fp32 (once, cached)", 0, steps)
        art = resolve(model, artifacts_dir, tokenizer)
        if art.tokenizer_path is None:
            raise EngineError(f"model {model} needs its tokenizer.json: pass --tokenizer FILE")
        task, output = detect_task(model_outputs(art.onnx_path, art.name), task, art.name)
        logits = output if task == "classifier" else None
        progress("export fp32 (once, cached)", 1, steps)
        texts = read_sentences(validation or DEFAULT_VALIDATION)
        calib = read_sentences(calibration, limit=256) if calibration else None
        candidate = art.onnx_path if precision == "fp32" else lower(art, precision, calib)
        progress(f"build {precision}", 2, steps)
        ref = measure(art.onnx_path, art, "fp32", texts, logits)
        got = ref if precision == "fp32" else measure(candidate, art, precision, texts, logits)
        progress("report", steps, steps)
    except (EngineError, OSError, RuntimeError) as exc:
        emit(f"build failed: {exc}")
        return 1
    emit(f"\naccuracy report: {art.name} {precision} vs fp32 ({task}) on {len(texts)} validation "
         "sentences")  # fmt: skip
    record: dict[str, Any] = {
        "model": art.name, "task": task, "precision": precision, "model_hash": art.model_hash,
        "speedup_cpu": ref.seconds / got.seconds, "size_mb": candidate.stat().st_size / 1e6,
        "validation": len(texts),
    }  # fmt: skip
    if logits is not None:
        score = agreement(ref.vectors, got.vectors)
        emit(f"  classes: {ref.vectors.shape[1]} (output {logits!r})")
        _table(emit, ref, got, len(texts), [("top-1 agree", 1.0, score.top1, "{:.4f}"),
               ("flipped", 0, score.flipped, "{:d}"),
               ("max-p drift", 0.0, score.max_prob_drift, "{:.5f}")])  # fmt: skip
        record |= {"top1_agreement": score.top1, "flipped": score.flipped,
                   "mean_max_prob_drift": score.max_prob_drift, "bound": min_agreement}  # fmt: skip
        ok, what = score.top1 >= min_agreement, f"top-1 agreement {score.top1:.4f}"
        bound = min_agreement
    else:
        cos = (ref.vectors * got.vectors).sum(axis=1)
        _table(emit, ref, got, len(texts), [("mean cos", 1.0, float(cos.mean()), "{:.5f}"),
               ("min cos", 1.0, float(cos.min()), "{:.5f}"),
               ("p1 cos", 1.0, float(np.percentile(cos, 1)), "{:.5f}")])  # fmt: skip
        record |= {"mean_cosine": float(cos.mean()), "min_cosine": float(cos.min()),
                   "bound": min_cosine}  # fmt: skip
        ok, what = float(cos.mean()) >= min_cosine, f"mean cosine {cos.mean():.5f}"
        bound = min_cosine
    if precision == "fp16":
        emit("  note: ONNX Runtime's CPU provider has few FP16 kernels (it inserts casts), so "
             "FP16 is usually slower on a CPU; it pays off on CUDA/TensorRT.")  # fmt: skip
    report = _report_path(art, precision)
    if not ok:
        emit(f"REFUSED: {what} to fp32 is below the bound {bound}; "
             f"the candidate stays at {candidate} and is not promoted")  # fmt: skip
        report.write_text(json.dumps(record, indent=2))
        return 1
    promoted = promoted_path(art.onnx_path, precision)
    if candidate != promoted:
        # the stamp first: serving refuses this file once the model it came from changes
        write_stamp(promoted, candidate.stat().st_size, art.model_hash)
        candidate.replace(promoted)
    report.write_text(json.dumps(record, indent=2))
    emit(f"promoted: {promoted} ({what} ≥ {bound})")
    return 0


def _report_path(art: ModelArtifact, precision: str) -> Path:
    """report.int8.json in a builtin's artifact folder; clf.report.int8.json beside clf.onnx."""
    prefix = "" if art.source_dir is not None else f"{art.onnx_path.stem}."
    return art.onnx_path.with_name(f"{prefix}report.{precision}.json")


def _table(
    emit: Callable[[str], None],
    ref: Measured,
    got: Measured,
    n: int,
    metrics: list[tuple[str, float, float, str]],
) -> None:
    """One row for fp32 and one for the candidate: size, speed, then (name, fp32 value, value)."""
    head = "".join(f"{name:>{len(name) + 2}}" for name, *_ in metrics)
    emit(f"  {'precision':<10}{'size MB':>9}{'sent/s':>9}{'speed-up':>10}{head}")
    rows = [(ref, [(name, fmt.format(r)) for name, r, _, fmt in metrics])]
    if got is not ref:
        rows.append((got, [(name, fmt.format(v)) for name, _, v, fmt in metrics]))
    for m, values in rows:
        cells = "".join(f"{v:>{len(name) + 2}}" for name, v in values)
        emit(f"  {m.precision:<10}{m.path.stat().st_size / 1e6:>9.1f}"
             f"{n / m.seconds:>9.0f}{ref.seconds / m.seconds:>9.2f}x{cells}")  # fmt: skip
