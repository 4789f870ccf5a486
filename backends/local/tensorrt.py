"""Native TensorRT engine (GPU only), written against TensorRT 10's Python API; import-gated.

Build from ONNX (FP32/FP16, INT8 with an entropy calibrator), one optimisation profile over
(batch, tokens), engines cached by GPU model + TensorRT version + model hash (not portable),
device buffers allocated once at the profile's maximum shape (torch CUDA tensors).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from backends.errors import EngineError
from backends.local.artifacts import ModelArtifact, default_artifacts_dir
from backends.local.engine import TensorSpec
from backends.local.metrics import LocalMetrics

log = logging.getLogger("latentgate.local")


def unavailable_reason() -> str | None:
    """None when TensorRT can run here; else the message check-config and start-up print."""
    try:
        import tensorrt  # noqa: F401
    except ImportError as exc:
        return (
            "kind tensorrt needs the NVIDIA `tensorrt` Python package and a CUDA GPU, and "
            f"tensorrt is not installed here ({exc}); use kind: onnxruntime (its providers: auto "
            "uses TensorRT or CUDA when onnxruntime-gpu has them)"
        )
    try:
        import torch
    except ImportError:
        return "kind tensorrt needs torch with CUDA for its device buffers; torch is not installed"
    if not torch.cuda.is_available():
        return "kind tensorrt needs a CUDA GPU; none is visible here"
    return None


def engine_cache_path(
    art: ModelArtifact,
    artifacts_dir: str | None,
    gpu: str,
    trt_version: str,
    precision: str,
    max_batch: int,
    max_tokens: int,
) -> Path:
    """Engines are specific to the GPU model and TensorRT version: both are in the key."""
    gpu_key = re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-").lower()
    return (
        default_artifacts_dir(artifacts_dir)
        / f"{art.name}-{art.model_hash[:16]}"
        / f"trt-{gpu_key}-{trt_version}-{precision}-b{max_batch}-t{max_tokens}.plan"
    )


def _calibrator(
    trt: Any,
    torch: Any,
    batches: Callable[[], Iterator[dict[str, NDArray[Any]]]],
    batch_size: int,
    cache: Path,
) -> Any:
    class Calibrator(trt.IInt8EntropyCalibrator2):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self._it = batches()
            self._keep: dict[str, Any] = {}

        def get_batch_size(self) -> int:
            return batch_size

        def get_batch(self, names: list[str]) -> list[int] | None:
            feeds = next(self._it, None)
            if feeds is None:
                return None
            self._keep = {n: torch.from_numpy(feeds[n]).cuda() for n in names}
            return [int(self._keep[n].data_ptr()) for n in names]

        def read_calibration_cache(self) -> bytes | None:
            return cache.read_bytes() if cache.exists() else None

        def write_calibration_cache(self, data: bytes) -> None:
            cache.write_bytes(bytes(data))

    return Calibrator()


class TrtEngine:
    kind = "tensorrt"
    batch_invariant = True  # (its INT8 is calibrated: fixed scales)

    def __init__(
        self,
        plan: bytes,
        name: str,
        max_batch: int,
        max_tokens: int,
        metrics: LocalMetrics | None = None,
    ) -> None:
        import tensorrt as trt
        import torch

        self._trt, self._torch = trt, torch
        self.name = name
        self.device = "cuda"
        self.providers = ["TensorRT"]
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._engine = trt.Runtime(self._logger).deserialize_cuda_engine(plan)
        if self._engine is None:
            raise EngineError(f"TensorRT could not deserialize the engine for {name}")
        self._ctx = self._engine.create_execution_context()
        self._stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        # One context and one set of buffers: two runs at once (batching off runs requests on
        # the default executor's threads) would write each other's rows. Engines are thread-safe.
        self._lock = threading.Lock()
        self.inputs: list[TensorSpec] = []
        self.outputs: list[TensorSpec] = []
        self._buffers: dict[str, Any] = {}
        for i in range(self._engine.num_io_tensors):
            tname = self._engine.get_tensor_name(i)
            dtype = torch.from_numpy(
                np.empty(0, trt.nptype(self._engine.get_tensor_dtype(tname)))
            ).dtype
            shape = tuple(self._engine.get_tensor_shape(tname))
            is_input = self._engine.get_tensor_mode(tname) == trt.TensorIOMode.INPUT
            full = [
                max_batch if d == -1 and k == 0 else max_tokens if d == -1 else d
                for k, d in enumerate(shape)
            ]
            # Pre-allocated once at the profile's maximum; each run uses a leading slice.
            self._buffers[tname] = torch.empty(full, dtype=dtype, device="cuda")
            dt = str(dtype).removeprefix("torch.")
            spec = TensorSpec(
                tname,
                {"float32": "FP32", "float16": "FP16", "int64": "INT64", "int32": "INT32"}.get(
                    dt, dt.upper()
                ),
                shape,
            )
            (self.inputs if is_input else self.outputs).append(spec)
        log.info(
            "engine %s: TensorRT %s on %s", name, trt.__version__, torch.cuda.get_device_name()
        )
        if metrics is not None:
            metrics.engine_info.labels(name, self.kind, "cuda", "TensorRT").set(1)
            metrics.sessions.labels(name).inc()

    @classmethod
    def from_onnx(
        cls,
        art: ModelArtifact,
        *,
        precision: str = "fp16",
        max_tokens: int = 256,
        max_batch: int = 64,
        artifacts_dir: str | None = None,
        calibration: Callable[[], Iterator[dict[str, NDArray[Any]]]] | None = None,
        workspace_mib: int = 1024,
        metrics: LocalMetrics | None = None,
    ) -> TrtEngine:
        reason = unavailable_reason()
        if reason is not None:
            raise EngineError(reason)
        import tensorrt as trt
        import torch

        path = engine_cache_path(
            art,
            artifacts_dir,
            torch.cuda.get_device_name(),
            trt.__version__,
            precision,
            max_batch,
            max_tokens,
        )
        if not path.exists():
            plan = build_plan(
                art.onnx_path,
                precision,
                max_batch,
                max_tokens,
                workspace_mib,
                calibration,
                path.with_suffix(".calib"),
            )
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(plan)
        return cls(path.read_bytes(), art.name, max_batch, max_tokens, metrics)

    def run(self, feeds: dict[str, Any]) -> dict[str, NDArray[Any]]:
        with self._lock:
            return self._run(feeds)

    def _run(self, feeds: dict[str, Any]) -> dict[str, NDArray[Any]]:
        torch = self._torch
        with torch.cuda.stream(self._stream):
            for spec in self.inputs:
                value = feeds[spec.name]
                src = value if hasattr(value, "data_ptr") else torch.from_numpy(np.asarray(value))
                view = dense_prefix(self._buffers[spec.name], tuple(src.shape))
                view.copy_(src, non_blocking=True)
                self._ctx.set_input_shape(spec.name, tuple(src.shape))
                self._ctx.set_tensor_address(spec.name, view.data_ptr())
            for spec in self.outputs:
                self._ctx.set_tensor_address(spec.name, self._buffers[spec.name].data_ptr())
            if not self._ctx.execute_async_v3(self._stream.cuda_stream):
                raise EngineError(f"TensorRT run failed for {self.name}")
            out = {}
            for spec in self.outputs:
                shape = tuple(self._ctx.get_tensor_shape(spec.name))
                out[spec.name] = dense_prefix(self._buffers[spec.name], shape).float().cpu().numpy()
        self._stream.synchronize()
        return out

    def close(self) -> None:
        self._buffers.clear()


def dense_prefix(buf: Any, shape: tuple[int, ...]) -> Any:
    """The first elements of a buffer allocated at the profile's maximum, as a dense tensor of
    `shape`: TensorRT reads and writes a tensor densely from its address. (A slice
    `buf[:b, :s]` is strided by the maximum width, so with s under it, row 1 on was read from
    row 0's tail and stale tokens of earlier batches.)"""
    return buf.view(-1)[: int(np.prod(shape))].view(shape)


def build_plan(
    onnx_path: Path,
    precision: str,
    max_batch: int,
    max_tokens: int,
    workspace_mib: int,
    calibration: Callable[[], Iterator[dict[str, NDArray[Any]]]] | None,
    calib_cache: Path,
) -> bytes:
    """ONNX → serialized TensorRT engine with one dynamic-shape optimisation profile."""
    import tensorrt as trt
    import torch

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_path.read_bytes()):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EngineError(f"TensorRT could not parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mib << 20)
    profile = builder.create_optimization_profile()
    for i in range(network.num_inputs):
        inp = network.get_input(i)
        profile.set_shape(
            inp.name,
            (1, 1),
            (max(1, max_batch // 2), min(128, max_tokens)),
            (max_batch, max_tokens),
        )
    config.add_optimization_profile(profile)
    if precision in ("fp16", "int8"):
        config.set_flag(trt.BuilderFlag.FP16)
    if precision == "int8":
        if calibration is None:
            raise EngineError("INT8 needs a calibration set (--calibration FILE)")
        config.set_flag(trt.BuilderFlag.INT8)
        config.int8_calibrator = _calibrator(trt, torch, calibration, max_batch, calib_cache)
        config.set_calibration_profile(profile)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise EngineError(f"TensorRT failed to build an engine from {onnx_path}")
    return bytes(plan)
