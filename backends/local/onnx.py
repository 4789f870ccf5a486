"""ONNX Runtime engine: one InferenceSession, providers by preference, IO binding on the GPU.

Foreign errors (onnxruntime's) are translated to EngineError here; callers never see them.
"""

from __future__ import annotations

import logging
import mmap
import os
from typing import Any

import numpy as np
from numpy.typing import NDArray

from backends.errors import BadInput, EngineError
from backends.local.auto import choose_providers, device_of
from backends.local.engine import V2_DATATYPES, TensorSpec
from backends.local.metrics import LocalMetrics
from backends.settings import SessionOptions

log = logging.getLogger("latentgate.local")

_LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}


def _spec(arg: Any) -> TensorSpec:
    elem = str(arg.type).removeprefix("tensor(").removesuffix(")")
    shape = tuple(d if isinstance(d, int) else -1 for d in arg.shape)
    return TensorSpec(arg.name, V2_DATATYPES.get(elem, elem.upper()), shape)


class OrtEngine:
    """Thread-safe: InferenceSession.run may be called from several threads at once."""

    kind = "onnxruntime"

    def __init__(
        self,
        path: str,
        name: str,
        providers: str | list[str] = "auto",
        session: SessionOptions | None = None,
        metrics: LocalMetrics | None = None,
    ) -> None:
        import onnxruntime as ort

        self._ort = ort
        self._invalid_argument: type[Exception] = _invalid_argument_class()
        self.name = name
        opts = session or SessionOptions()
        so = ort.SessionOptions()
        so.graph_optimization_level = getattr(
            ort.GraphOptimizationLevel, _LEVELS[opts.graph_optimization]
        )
        so.intra_op_num_threads = opts.intra_op_threads
        so.inter_op_num_threads = opts.inter_op_threads
        so.add_session_config_entry(
            "session.intra_op.allow_spinning", "1" if opts.allow_spinning else "0"
        )
        so.log_severity_level = 3
        wanted = choose_providers(providers)
        try:
            self._sess = ort.InferenceSession(path, so, providers=wanted)
        except Exception as exc:  # onnxruntime raises bare RuntimeError subclasses
            raise EngineError(f"ONNX Runtime could not load {path}: {exc}") from None
        # What actually loaded: a provider whose libraries are missing is dropped silently by ORT.
        self.providers: list[str] = list(self._sess.get_providers())
        self.device = device_of(self.providers)
        self.inputs = [_spec(a) for a in self._sess.get_inputs()]
        self.outputs = [_spec(a) for a in self._sess.get_outputs()]
        self._input_names = {s.name for s in self.inputs}
        self.batch_invariant = not dynamically_quantized(path)
        if not self.batch_invariant:
            log.warning(
                "engine %s: dynamically quantized (activation scales are taken over a whole "
                "run), so requests never share a run; a calibrated (static) INT8 graph batches",
                name,
            )
        asked_device = device_of(wanted)
        if asked_device != self.device:
            log.warning(
                "engine %s wanted %s (%s) but runs on %s: falling back",
                name,
                asked_device,
                wanted[0],
                self.device,
            )
            if metrics is not None:
                metrics.fallbacks.labels(name, asked_device, self.device).inc()
        # The one line that names the device (later lines about this engine do not repeat it).
        why = (
            "; providers auto: no TensorRT or CUDA in this onnxruntime build"
            if providers == "auto" and self.device == "cpu"
            else ""
        )
        log.info(
            "engine %s: onnxruntime on %s (providers: %s; graph %s%s)",
            name,
            self.device,
            ", ".join(self.providers),
            os.path.basename(path),  # model.fp32.fused.onnx: ONNX Runtime's fused kernels
            why,
        )
        if metrics is not None:
            metrics.engine_info.labels(name, self.kind, self.device, self.providers[0]).set(1)
            metrics.sessions.labels(name).inc()

    def run(self, feeds: dict[str, Any]) -> dict[str, NDArray[Any]]:
        feeds = {k: v for k, v in feeds.items() if k in self._input_names}
        try:
            if self.device == "cuda":
                return self._run_bound(feeds)
            names = [o.name for o in self.outputs]
            return dict(zip(names, self._sess.run(names, feeds), strict=True))
        except self._invalid_argument as exc:
            # the request's values, not the engine, are at fault (an index past an embedding
            # table, say): the client's 400, not a 500 counted against the engine; its batch
            # mates are unaffected, since a failed joined run is re-run request by request
            raise BadInput(f"model {self.name} refused the input: {_status_message(exc)}") from None
        except Exception as exc:  # onnxruntime's errors → our tree
            raise EngineError(f"engine {self.name} failed: {exc}") from None

    def _run_bound(self, feeds: dict[str, Any]) -> dict[str, NDArray[Any]]:
        """Inputs and outputs in device memory; torch CUDA tensors are bound without a copy."""
        binding = self._sess.io_binding()
        keep: list[Any] = []  # the OrtValues must outlive the run
        for name, value in feeds.items():
            if hasattr(value, "data_ptr") and getattr(value, "is_cuda", False):
                value = value.contiguous()
                keep.append(value)
                binding.bind_input(
                    name,
                    "cuda",
                    value.device.index or 0,
                    np.dtype(str(value.dtype).removeprefix("torch.")),
                    tuple(value.shape),
                    value.data_ptr(),
                )
            else:
                ov = self._ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value), "cuda", 0)
                keep.append(ov)
                binding.bind_ortvalue_input(name, ov)
        for out in self.outputs:
            binding.bind_output(out.name, "cuda", 0)
        self._sess.run_with_iobinding(binding)
        return dict(zip([o.name for o in self.outputs], binding.copy_outputs_to_cpu(), strict=True))

    def close(self) -> None:
        del self._sess


# The op types (all named DynamicQuantize*: ...Linear, ...MatMul, ...LSTM) that quantize an
# activation with a scale taken from the whole tensor, every row of every request in the run;
# onnxruntime.quantization.quantize_dynamic writes them.
_DYNAMIC_QUANTIZE = b"DynamicQuantize"


def dynamically_quantized(path: str) -> bool:
    """The graph has a DynamicQuantize* node. The file's bytes are searched for the op type
    rather than parsed: the serving process does not depend on the onnx package, and a false
    positive (the name in a doc string) costs throughput, never a wrong answer."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        return m.find(_DYNAMIC_QUANTIZE) != -1


def _invalid_argument_class() -> type[Exception]:
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    cls: type[Exception] = state.InvalidArgument
    return cls


def _status_message(exc: Exception) -> str:
    """onnxruntime's "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : ... Status Message: why": why."""
    text = str(exc)
    return text.rpartition("Status Message: ")[2].strip() or text
