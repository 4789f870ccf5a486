"""LocalBackend: a model run in-process, speaking the same HTTP APIs a remote replica would.

It answers OpenAI `/v1/embeddings` (embedders) and Open Inference v2 (health, metadata, ready,
infer) itself, so routes, caches and metrics in front of it work unchanged. Loading and warm-up
run in the background from `start()`; `ready()` is false until both are done.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from backends import v2tensors
from backends.base import UpstreamRequest, UpstreamResponse
from backends.errors import BadInput, EngineError, ModelNotFound
from backends.local.artifacts import BUILTIN_PREFIX, builtin_dir, resolve
from backends.local.metrics import LocalMetrics
from backends.local.openai_embeddings import embeddings_response, parse_embeddings
from backends.local.progress import LoadProgress
from backends.local.shared import EngineShare
from backends.local.tensor_model import TensorModel
from backends.local.text_encoder import TextEncoder, load_text_encoder
from backends.local.v2codec import BINARY_HEADER, decode_infer, encode_infer
from backends.settings import ImagePreprocess, OnnxBackendSettings, TensorRTBackendSettings

log = logging.getLogger("latentgate.local")
_MODEL_PATH = re.compile(
    r"^/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?(?P<op>/infer|/ready|/config|/stats)?/?$"
)
LocalSettings = OnnxBackendSettings | TensorRTBackendSettings


def preflight(name: str, spec: LocalSettings) -> str | None:
    """What would stop this backend from starting, found before the server listens."""
    if isinstance(spec, TensorRTBackendSettings):
        from backends.local.tensorrt import unavailable_reason

        reason = unavailable_reason()
        if reason is not None:
            return f"backend {name!r}: {reason}"
    try:
        if spec.model.startswith(BUILTIN_PREFIX):
            builtin_dir(spec.model.removeprefix(BUILTIN_PREFIX))
        elif not Path(spec.model).expanduser().is_file():
            return f"backend {name!r}: model file {spec.model!r} does not exist"
        elif (problem := _tokenizer_problem(spec)) is not None:
            return f"backend {name!r}: {problem}"
    except EngineError as exc:
        return f"backend {name!r}: {exc}"
    return None


def _tokenizer_problem(spec: LocalSettings) -> str | None:
    """An embedder from an ONNX file reads its tokenizer.json while it loads, in the background:
    one that is not there was never said (/readyz said "load" for good, requests got a 500)."""
    if spec.task != "embed" or isinstance(spec.preprocess, ImagePreprocess):
        return None
    tokenizer = spec.preprocess.tokenizer if spec.preprocess is not None else None
    if tokenizer is None:
        return f"model {spec.model!r} needs its tokenizer.json (preprocess.tokenizer)"
    if not Path(tokenizer).expanduser().is_file():
        return f"tokenizer file {tokenizer!r} does not exist (preprocess.tokenizer)"
    return None


def _json(doc: Any, status: int = 200) -> UpstreamResponse:
    body = json.dumps(doc).encode()
    return UpstreamResponse(status, "OK" if status == 200 else "Unavailable",
                            [("Content-Type", "application/json")], body=body)  # fmt: skip


class LocalBackend:
    timing_stage = "engine"
    computes_here = True  # its work is this machine's CPU: dropped when the client hangs up

    def __init__(
        self,
        name: str,
        spec: LocalSettings,
        metrics: LocalMetrics,
        engines: EngineShare | None = None,
    ) -> None:
        problem = preflight(name, spec)
        if problem is not None:
            raise EngineError(problem)
        self.name = name
        self.spec = spec
        self.metrics = metrics
        self.engines = engines
        default = spec.model.removeprefix(BUILTIN_PREFIX)
        self.model_name = spec.served_name or (
            default if spec.model.startswith(BUILTIN_PREFIX) else Path(spec.model).stem
        )
        self.encoder: TextEncoder | None = None
        self.tensors: TensorModel | None = None
        self._task: asyncio.Task[None] | None = None
        self._error: str | None = None
        self.progress = LoadProgress()

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._load())

    async def _load(self) -> None:
        try:
            await asyncio.to_thread(self._load_sync)
        except Exception as exc:  # whatever ended the load, /readyz says it
            # (a tokenizer.json that does not parse raises the tokenizers library's Exception:
            # the load was shown as still going, and requests answered 500)
            error = exc if isinstance(exc, EngineError) else EngineError(f"{exc}")
            self._error = str(error)
            self.progress.step("failed", str(error))
            log.error("backend %s failed to load: %s", self.name, error)
            raise error from None
        took = self.progress.snapshot()["elapsed_s"]
        self.progress.step("ready")
        log.info("backend %s: %s ready in %.1f s", self.name, self.model_name, took)

    def _load_sync(self) -> None:
        s = self.spec
        text = s.preprocess if s.preprocess is not None and s.preprocess.kind == "text" else None
        kw: dict[str, Any] = {}
        if isinstance(s, TensorRTBackendSettings):
            kw = {"engine": "tensorrt", "precision": s.precision, "calibration": s.calibration}
        else:
            kw = {"providers": s.providers, "session": s.session, "precision": s.precision}
        if s.task == "embed":
            self.encoder = load_text_encoder(
                s.model, artifacts_dir=s.artifacts_dir,
                tokenizer=text.tokenizer if text else None,
                max_tokens=text.max_tokens if text else None,
                truncate=text.truncate if text else False,
                batching=s.batching, metrics=self.metrics, warmup=s.warmup,
                share=self.engines, progress=self.progress, **kw,
            )  # fmt: skip
            self.encoder.ready = True
            return
        from backends.local.onnx import OrtEngine

        if isinstance(s, TensorRTBackendSettings):
            raise EngineError("kind tensorrt serves embedders only (task: embed) for now")
        art = resolve(s.model, s.artifacts_dir, precision=s.precision, progress=self.progress)
        self.progress.step("load", str(art.serving_path("onnxruntime", s.precision)))
        engine = OrtEngine(
            str(art.serving_path("onnxruntime", s.precision)),
            self.model_name,
            s.providers,
            s.session,
            self.metrics,
        )
        image = s.preprocess if isinstance(s.preprocess, ImagePreprocess) else None
        self.tensors = TensorModel(self.model_name, engine, s.batching, image, self.metrics)
        if s.warmup:
            self.progress.step("warmup")
            self.tensors.warmup()
        self.tensors.ready = True

    async def _loaded(self) -> None:
        if self._task is None:
            await self.start()
        assert self._task is not None
        try:
            await asyncio.shield(self._task)
        except EngineError as exc:
            raise EngineError(f"backend {self.name} could not load its model: {exc}") from None

    def ready(self) -> bool:
        model = self.encoder or self.tensors
        return model is not None and model.ready

    def describe(self) -> dict[str, object]:
        model = self.encoder or self.tensors
        return {
            "kind": self.spec.kind, "model": self.model_name, "task": self.spec.task,
            "device": model.device if model else None,
            "providers": list(model.providers) if model else None,
            "batching": self.spec.batching.model_dump(), "error": self._error,
            "load": self.progress.snapshot(),
        }  # fmt: skip

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        path = request.path_qs.split("?", 1)[0]
        method = request.method.upper()
        if path in ("/v2/health/live", "/v2/health/ready"):
            ok = path.endswith("live") or self.ready()
            return _json({"live" if path.endswith("live") else "ready": ok}, 200 if ok else 503)
        if path.rstrip("/") == "/v2":
            return _json({"name": "latentgate", "version": "0.1.0",
                          "extensions": ["binary_tensor_data"]})  # fmt: skip
        body = request.body if isinstance(request.body, bytes) else b""
        ctype = _header(request, "content-type")
        if path.rstrip("/") == "/v1/embeddings" and method == "POST":
            return await self._embeddings(body, ctype)
        m = _MODEL_PATH.match(path)
        if m is None:
            raise ModelNotFound(f"{method} {path} is not served by local model {self.model_name}")
        if m.group("name") != self.model_name:
            raise ModelNotFound(f"model '{m.group('name')}' is not served here")
        if m.group("version") not in (None, "1"):  # a local model has one version: "1"
            raise ModelNotFound(
                f"model '{self.model_name}' has no version {m.group('version')!r} (versions: 1)"
            )
        op = m.group("op")
        if op == "/ready":
            return _json({"ready": self.ready()}, 200 if self.ready() else 503)
        await self._loaded()
        if op is None:
            return _json(self._metadata())
        if op == "/config" and method in ("GET", "HEAD"):
            return _json(v2tensors.model_config(self._metadata()))
        if op == "/infer" and method == "POST":
            return await self._infer(body, _header(request, BINARY_HEADER), ctype)
        raise ModelNotFound(f"{method} {path} is not served by local model {self.model_name}")

    async def _embeddings(self, body: bytes, ctype: str | None) -> UpstreamResponse:
        req = await _maybe_thread(len(body) > _INLINE_BYTES, parse_embeddings, body, ctype)
        if req.model != self.model_name:
            raise ModelNotFound(
                f"model '{req.model}' is not served here (this is {self.model_name})"
            )
        await self._loaded()
        if self.encoder is None:
            raise BadInput(f"model {self.model_name} is not an embedding model")
        if req.dimensions is not None and req.dimensions != self.encoder.dim:
            raise BadInput(f"'dimensions' must be {self.encoder.dim} for {self.model_name}")
        tokens = await self.encoder.atokenize(req.texts)
        vectors = await self.encoder.aencode_tokens(tokens)
        body = await _maybe_thread(len(tokens) > _INLINE_ROWS, embeddings_response,
                                   self.model_name, vectors, sum(len(t.ids) for t in tokens),
                                   req.encoding_format)  # fmt: skip
        return UpstreamResponse(200, "OK", [("Content-Type", "application/json")], body=body)

    def _metadata(self) -> dict[str, Any]:
        if self.encoder is not None:
            inputs = [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
            outputs = [{"name": "embedding", "datatype": "FP32", "shape": [-1, self.encoder.dim]}]
        else:
            assert self.tensors is not None
            inputs = [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)}
                      for s in self.tensors.inputs]  # fmt: skip
            outputs = [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)}
                       for s in self.tensors.outputs]  # fmt: skip
        platform = "tensorrt_plan" if self.spec.kind == "tensorrt" else "onnxruntime_onnx"
        return {"name": self.model_name, "versions": ["1"], "platform": platform,
                "inputs": inputs, "outputs": outputs}  # fmt: skip

    async def _infer(
        self, body: bytes, header_length: str | None, ctype: str | None
    ) -> UpstreamResponse:
        req = await _maybe_thread(
            len(body) > _INLINE_BYTES, decode_infer, body, header_length, ctype
        )
        if self.encoder is not None:
            texts = self._texts(req.inputs)
            vectors = await self.encoder.aencode_tokens(await self.encoder.atokenize(texts))
            outputs = {"embedding": ("FP32", vectors)}
        else:
            assert self.tensors is not None
            feeds = await self.tensors.acheck(req.inputs)
            result = await self.tensors.arun(feeds)
            specs = {s.name: s.datatype for s in self.tensors.outputs}
            outputs = {k: (specs.get(k, "FP32"), v) for k, v in result.items()}
        # by elements, not rows: one row of 4M floats took seconds to write as JSON, on the loop
        rows = max((len(v[1]) if np.ndim(v[1]) else 1 for v in outputs.values()), default=0)
        elements = sum(int(np.size(v[1])) for v in outputs.values())
        payload, headers = await _maybe_thread(
            rows > _INLINE_ROWS or elements > _INLINE_ELEMENTS,
            encode_infer,
            self.model_name,
            req,
            outputs,
        )
        return UpstreamResponse(200, "OK", headers, body=payload)

    def _texts(self, inputs: dict[str, tuple[str, list[int], Any]]) -> list[str]:
        extra = [n for n in inputs if n != "text"]
        if extra or "text" not in inputs:
            raise BadInput(f"model {self.model_name} takes one input 'text' (BYTES, shape [n]); "
                           f"got {', '.join(inputs) or 'none'}")  # fmt: skip
        datatype, shape, value = inputs["text"]
        if datatype != "BYTES":
            raise BadInput(f"input 'text' must be BYTES, got {datatype}")
        if len(shape) not in (1, 2) or (len(shape) == 2 and shape[1] != 1):
            raise BadInput(f"input 'text' has shape {shape}; the model takes [n] or [n, 1]")
        if not value:
            raise BadInput("input 'text' is empty")
        try:
            return [v.decode() for v in value]
        except UnicodeDecodeError:
            raise BadInput("input 'text' must hold UTF-8 strings") from None

    async def aclose(self) -> None:
        self.progress.stop()  # a load still building its model ends, or the process waits for it
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self.encoder is not None:
            await self.encoder.aclose()
        if self.tensors is not None:
            await self.tensors.aclose()


# Bodies and result sets past these sizes are decoded and encoded in a worker thread: JSON of
# megabytes (or of thousands of vectors) would otherwise hold the event loop for 10-100s of ms.
_INLINE_BYTES = 256 << 10
_INLINE_ROWS = 64
_INLINE_ELEMENTS = 1 << 16
_R = TypeVar("_R")


async def _maybe_thread(big: bool, fn: Callable[..., _R], *args: Any) -> _R:
    return await asyncio.to_thread(fn, *args) if big else fn(*args)


def _header(request: UpstreamRequest, name: str) -> str | None:
    for k, v in request.headers:
        if k.lower() == name:
            return v
    return None
