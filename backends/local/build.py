"""`latentgate build`: export, lower precision, measure against FP32, promote only within a bound.

FP16 converts the ONNX graph (inputs/outputs stay FP32); INT8 is ONNX Runtime quantisation:
static with a calibration set, dynamic without. A candidate whose mean cosine to the FP32
embeddings on the validation set falls below the bound is kept aside and not promoted.
"""

from __future__ import annotations

import csv
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
from backends.local.artifacts import ModelArtifact, resolve
from backends.local.onnx import OrtEngine
from backends.local.text_encoder import TextEncoder
from backends.preprocess.cpu import TextPreprocessor, pad_tokens
from backends.settings import BatcherSettings

DEFAULT_VALIDATION = "/work/shared/data/stsb/sts-dev.csv"
VALIDATION_LIMIT = 512


def progress(label: str, done: int, total: int, width: int = 30) -> None:
    filled = int(width * done / max(total, 1))
    end = "\n" if done >= total else ""
    bar = "#" * filled + "." * (width - filled)
    print(f"\r{label:<28} [{bar}] {done}/{total}", end=end, file=sys.stderr, flush=True)


def read_sentences(path: str, limit: int = VALIDATION_LIMIT) -> list[str]:
    """STS-B rows (tab-separated, sentences in columns 6 and 7) or plain text, one per line."""
    p = Path(path)
    if not p.is_file():
        raise EngineError(f"validation/calibration file {path} does not exist")
    out: list[str] = []
    with p.open(encoding="utf-8") as f:
        if p.suffix == ".csv":
            for row in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
                out.extend(s for s in row[5:7] if s)
        else:
            out = [line.strip() for line in f if line.strip()]
    return list(dict.fromkeys(out))[:limit]


def top1_agreement(reference: NDArray[Any], candidate: NDArray[Any]) -> float:
    """For classifiers: the share of inputs whose arg-max class is unchanged."""
    return float((reference.argmax(axis=-1) == candidate.argmax(axis=-1)).mean())


@dataclass
class Measured:
    precision: str
    path: Path
    vectors: NDArray[np.float32]
    seconds: float


def _encoder(path: Path, art: ModelArtifact) -> TextEncoder:
    assert art.tokenizer_path is not None
    engine = OrtEngine(str(path), art.name, ["CPUExecutionProvider"])
    pre = TextPreprocessor.from_file(str(art.tokenizer_path), art.max_tokens or 512, True)
    return TextEncoder(art.name, engine, pre, BatcherSettings())


def measure(path: Path, art: ModelArtifact, precision: str, texts: list[str]) -> Measured:
    enc = _encoder(path, art)
    enc.encode(texts[:8])  # warm-up outside the timing
    rows, t0 = [], time.perf_counter()
    for i in range(0, len(texts), 32):
        rows.append(enc.encode(texts[i : i + 32]))
        progress(f"encode {precision}", min(i + 32, len(texts)), len(texts))
    return Measured(precision, path, np.concatenate(rows), time.perf_counter() - t0)


def _calibration_reader(art: ModelArtifact, texts: list[str]) -> Any:
    from onnxruntime.quantization import CalibrationDataReader

    assert art.tokenizer_path is not None
    pre = TextPreprocessor.from_file(str(art.tokenizer_path), art.max_tokens or 512, True)

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._it: Iterator[dict[str, NDArray[np.int64]]] = (
                pad_tokens(pre.tokenize(texts[i : i + 16])) for i in range(0, len(texts), 16)
            )

        def get_next(self) -> dict[str, NDArray[np.int64]] | None:
            return next(self._it, None)

    return Reader()


def lower(art: ModelArtifact, precision: str, calibration: list[str] | None) -> Path:
    """Write the candidate ONNX file for `precision` next to the FP32 export."""
    out = art.onnx_path.with_name(f"model.{precision}.candidate.onnx")
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
    artifacts_dir: str | None = None,
    emit: Callable[[str], None] = print,
) -> int:
    """0: built and promoted; 1: refused (loss over the bound) or failed."""
    try:
        steps = 4
        progress("export fp32 (once, cached)", 0, steps)
        art = resolve(model, artifacts_dir)
        progress("export fp32 (once, cached)", 1, steps)
        texts = read_sentences(validation or DEFAULT_VALIDATION)
        calib = read_sentences(calibration, limit=256) if calibration else None
        candidate = art.onnx_path if precision == "fp32" else lower(art, precision, calib)
        progress(f"build {precision}", 2, steps)
        ref = measure(art.onnx_path, art, "fp32", texts)
        got = ref if precision == "fp32" else measure(candidate, art, precision, texts)
        progress("report", steps, steps)
    except (EngineError, OSError, RuntimeError) as exc:
        emit(f"build failed: {exc}")
        return 1
    cos = (ref.vectors * got.vectors).sum(axis=1)
    size_mb = candidate.stat().st_size / 1e6
    speedup = ref.seconds / got.seconds
    emit(f"\naccuracy report: {art.name} {precision} vs fp32 on {len(texts)} validation sentences")
    emit(f"  {'precision':<10}{'size MB':>9}{'sent/s':>9}{'speed-up':>10}{'mean cos':>10}"
         f"{'min cos':>9}{'p1 cos':>9}")  # fmt: skip
    for m, c in ((ref, np.ones(1)), (got, cos)):
        emit(f"  {m.precision:<10}{m.path.stat().st_size / 1e6:>9.1f}"
             f"{len(texts) / m.seconds:>9.0f}{ref.seconds / m.seconds:>9.2f}x"
             f"{c.mean():>10.5f}{c.min():>9.5f}{np.percentile(c, 1):>9.5f}")  # fmt: skip
    if precision == "fp16":
        emit("  note: ONNX Runtime's CPU provider has few FP16 kernels (it inserts casts), so "
             "FP16 is usually slower on a CPU; it pays off on CUDA/TensorRT.")  # fmt: skip
    mean_cos = float(cos.mean())
    record = {"model": art.name, "precision": precision, "model_hash": art.model_hash,
              "mean_cosine": mean_cos, "min_cosine": float(cos.min()), "bound": min_cosine,
              "speedup_cpu": speedup, "size_mb": size_mb, "validation": len(texts)}  # fmt: skip
    if mean_cos < min_cosine:
        emit(f"REFUSED: mean cosine {mean_cos:.5f} to fp32 is below the bound {min_cosine}; "
             f"the candidate stays at {candidate} and is not promoted")  # fmt: skip
        (candidate.parent / f"report.{precision}.json").write_text(json.dumps(record, indent=2))
        return 1
    promoted = art.onnx_path.with_name(f"model.{precision}.onnx")
    if candidate != promoted:
        candidate.replace(promoted)
    (promoted.parent / f"report.{precision}.json").write_text(json.dumps(record, indent=2))
    emit(f"promoted: {promoted} (mean cosine {mean_cos:.5f} ≥ {min_cosine})")
    return 0
