"""Settings value objects for upstream pools and local engines (no I/O here)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Timeouts(_Frozen):
    """Upstream timeouts in seconds; `total` bounds the whole exchange, body included."""

    connect: float = Field(2.0, gt=0)
    read: float = Field(60.0, gt=0)
    total: float = Field(300.0, gt=0)


class PoolLimits(_Frozen):
    """Connection pool bounds, per replica."""

    max_connections: int = Field(256, ge=1)
    keepalive_s: float = Field(60.0, gt=0)


class RemoteBackendSettings(_Frozen):
    """A pool of remote replicas (Envoy's cluster)."""

    kind: Literal["remote"] = "remote"
    replicas: list[str] = Field(min_length=1)
    pool: PoolLimits = PoolLimits()
    timeouts: Timeouts = Timeouts()

    @field_validator("replicas")
    @classmethod
    def _check_urls(cls, value: list[str]) -> list[str]:
        for url in value:
            if not (
                url.startswith("http://") or url.startswith("https://") or url.startswith("unix:")
            ):
                raise ValueError(f"replica {url!r} must be http(s)://host:port or unix:/path")
            if url.startswith("unix:") and len(url) <= len("unix:"):
                raise ValueError(f"replica {url!r} names no socket path")
        return value


class BatcherSettings(_Frozen):
    """Dynamic batching (Triton's knobs). `target_p95_ms` turns on adaptive waiting."""

    enabled: bool = True
    max_batch: int = Field(default=32, ge=1, le=4096)
    max_delay_ms: float = Field(default=2.0, ge=0, le=1000)
    # Upper edges of the length buckets (tokens); longer items go to one last bucket.
    buckets: list[int] = [16, 32, 64, 128, 256]
    target_p95_ms: float | None = Field(default=None, gt=0)


class TextPreprocess(_Frozen):
    kind: Literal["text"] = "text"
    tokenizer: str | None = None  # tokenizer.json; builtins bring their own
    max_tokens: int = Field(default=256, ge=1)
    # false: an input longer than max_tokens is a 400; true: it is cut (sentence-transformers' way)
    truncate: bool = False


class ImagePreprocess(_Frozen):
    kind: Literal["image"] = "image"
    size: tuple[int, int] = (224, 224)
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    max_bytes: int = Field(default=8 << 20, ge=1)


PreprocessSettings = Annotated[TextPreprocess | ImagePreprocess, Field(discriminator="kind")]


class SessionOptions(_Frozen):
    graph_optimization: Literal["disable", "basic", "extended", "all"] = "all"
    intra_op_threads: int = Field(default=0, ge=0)  # 0: ONNX Runtime's default (one per core)
    inter_op_threads: int = Field(default=0, ge=0)


class _LocalBackend(_Frozen):
    # An ONNX file, or `builtin:all-MiniLM-L6-v2` (exported from the packaged model on first use).
    model: str
    # The name clients use: OpenAI `model` and the v2 `/v2/models/{name}`; default: from `model`.
    served_name: str | None = None
    task: Literal["embed", "classify", "tensor"] = "embed"
    preprocess: PreprocessSettings | None = None
    batching: BatcherSettings = BatcherSettings()
    artifacts_dir: str | None = None  # default: $LATENTGATE_ARTIFACTS or ~/.cache/latentgate
    warmup: bool = True


class OnnxBackendSettings(_LocalBackend):
    """A model served in-process by ONNX Runtime."""

    kind: Literal["onnxruntime"] = "onnxruntime"
    # `auto` (TensorRT > CUDA > CPU, whichever load) or an explicit ordered list.
    providers: Literal["auto"] | list[str] = "auto"
    session: SessionOptions = SessionOptions()


class TensorRTBackendSettings(_LocalBackend):
    """A model compiled to a native TensorRT engine (GPU only)."""

    kind: Literal["tensorrt"] = "tensorrt"
    precision: Literal["fp32", "fp16", "int8"] = "fp16"
    calibration: str | None = None  # a text file, one calibration input per line (INT8)
    max_batch: int = Field(default=64, ge=1)
    max_tokens: int = Field(default=256, ge=1)
    workspace_mib: int = Field(default=1024, ge=64)


BackendSettings = Annotated[
    RemoteBackendSettings | OnnxBackendSettings | TensorRTBackendSettings,
    Field(discriminator="kind"),
]
