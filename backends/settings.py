"""Settings value objects for upstream pools and local engines (no I/O here)."""

from __future__ import annotations

from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

GRPC_READY_PATH = "/inference.GRPCInferenceService/ServerReady"
# The most of one replica answer a reader that needs it whole holds (a gRPC replica's reply is
# received whole): the gateway passes its limits.max_body_bytes, of which this is the default.
ANSWER_CAP = 16 << 20


def wire_of(url: str) -> Literal["http", "grpc"]:
    """What a replica speaks: `grpc://` and `grpc+unix:` replicas are gRPC, the rest HTTP/1.1."""
    return "grpc" if url.startswith(("grpc://", "grpc+unix:")) else "http"


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Timeouts(_Frozen):
    """Upstream timeouts in seconds; `total` bounds the whole exchange, body included."""

    connect: float = Field(default=2.0, gt=0)
    read: float = Field(default=60.0, gt=0)
    total: float = Field(default=300.0, gt=0)


class PoolLimits(_Frozen):
    """Connection pool bounds, per replica."""

    max_connections: int = Field(default=256, ge=1)
    keepalive_s: float = Field(default=60.0, gt=0)
    # HTTP/1.1 client for http:// and unix: replicas: the gateway's own (lean_http1.py, about
    # half the CPU per request) or aiohttp's. https:// replicas always use aiohttp's.
    http_client: Literal["lean", "aiohttp"] = "lean"


class BalancerSettings(_Frozen):
    """How a pool picks a replica. `affinity` hashes `hash_header` (e.g. X-Tenant) or, without
    one, the first `hash_body_prefix` bytes of the body (the conversation prefix) onto a ring."""

    policy: Literal["least_request", "round_robin", "weighted", "affinity"] = "least_request"
    weights: list[float] | None = None
    hash_header: str | None = None
    hash_body_prefix: int = Field(default=512, ge=1)
    # Bounded load: no replica takes more than load_factor x the mean outstanding requests.
    load_factor: float = Field(default=1.25, ge=1.0)


class HealthCheckSettings(_Frozen):
    """Active checks: a cheap GET per replica (never a billed model call)."""

    path: str = "/health"
    interval_s: float = Field(default=5.0, gt=0)
    timeout_s: float = Field(default=1.0, gt=0)
    unhealthy_threshold: int = Field(default=2, ge=1)
    healthy_threshold: int = Field(default=1, ge=1)


class OutlierSettings(_Frozen):
    """Passive outlier detection (Envoy's): errors and latency eject a replica for a while."""

    enabled: bool = True
    consecutive_errors: int = Field(default=5, ge=1)
    base_ejection_s: float = Field(default=30.0, gt=0)
    max_ejection_s: float = Field(default=300.0, gt=0)
    max_ejection_percent: float = Field(default=10.0, ge=0, le=100)
    interval_s: float = Field(default=1.0, gt=0)
    # Latency outlier: EWMA above factor x the pool median and at least min_excess_ms above it.
    latency_factor: float | None = Field(default=3.0, gt=1)
    latency_min_excess_ms: float = Field(default=50.0, ge=0)
    latency_min_samples: int = Field(default=20, ge=1)
    slow_start_s: float = Field(default=10.0, ge=0)


class BreakerSettings(_Frozen):
    """Circuit breaker per pool: beyond these limits requests get a fast 503 with Retry-After."""

    max_connections: int = Field(default=1024, ge=1)
    max_in_flight: int = Field(default=1024, ge=1)
    max_pending: int = Field(default=1024, ge=0)
    retry_after_s: float = Field(default=1.0, gt=0)


class RetryBudgetSettings(_Frozen):
    """Retries and hedges share one budget: at most `percent` of active requests in flight
    (never fewer than `min_concurrency`), and over time at most `percent` of requests plus
    `min_per_s` a second."""

    percent: float = Field(default=20.0, ge=0, le=100)
    # Envoy's default is 3; a killed replica's in-flight requests all need a retry at once.
    min_concurrency: int = Field(default=10, ge=0)
    min_per_s: float = Field(default=1.0, ge=0)
    reserve: float = Field(default=10.0, ge=0)


class RetrySettings(_Frozen):
    """Route retry policy: only failures before any byte reached the client are retried."""

    max: int = Field(default=2, ge=0)
    on_status: list[int] = [502, 503, 504]
    backoff_ms: float = Field(default=25.0, ge=0)
    max_backoff_ms: float = Field(default=250.0, ge=0)


class HedgeSettings(_Frozen):
    """Send a second copy to another replica when the first is slow: after a fixed delay, or
    after the pool's recent latency at a percentile (falling back to after_ms, then 50 ms)."""

    after_ms: float | None = Field(default=None, gt=0)
    after_percentile: float | None = Field(default=None, gt=0, lt=100)

    @model_validator(mode="after")
    def _one(self) -> HedgeSettings:
        if self.after_ms is None and self.after_percentile is None:
            raise ValueError("hedge needs after_ms or after_percentile")
        return self


class RouteTimeouts(_Frozen):
    """Per-route upstream timeouts in seconds; unset ones fall back to the backend's."""

    connect: float | None = Field(default=None, gt=0)
    first_byte: float | None = Field(default=None, gt=0)
    total: float | None = Field(default=None, gt=0)


class RoutePolicy(_Frozen):
    """Route policy for upstream calls (Envoy's route, not cluster, settings).

    idempotent: None means inference calls (openai, v2 routes) are, and passthrough routes
    follow the HTTP method. Only idempotent requests are retried or hedged.
    """

    idempotent: bool | None = None
    retries: RetrySettings = RetrySettings()
    hedge: HedgeSettings | None = None
    timeouts: RouteTimeouts = RouteTimeouts()


class RemoteBackendSettings(_Frozen):
    """A pool of remote replicas (Envoy's cluster)."""

    kind: Literal["remote"] = "remote"
    replicas: list[str] = Field(min_length=1)
    pool: PoolLimits = PoolLimits()
    timeouts: Timeouts = Timeouts()
    balancer: BalancerSettings = BalancerSettings()
    health_check: HealthCheckSettings | None = None
    outlier: OutlierSettings = OutlierSettings()
    breaker: BreakerSettings = BreakerSettings()
    retry_budget: RetryBudgetSettings = RetryBudgetSettings()

    @field_validator("replicas")
    @classmethod
    def _check_urls(cls, value: list[str]) -> list[str]:
        for url in value:
            if not url.startswith(("http://", "https://", "unix:", "grpc://", "grpc+unix:")):
                raise ValueError(
                    f"replica {url!r} must be http(s)://host:port, unix:/path, "
                    "grpc://host:port or grpc+unix:/path"
                )
            for prefix in ("unix:", "grpc+unix:"):
                if url.startswith(prefix) and len(url) <= len(prefix):
                    raise ValueError(f"replica {url!r} names no socket path")
            if url.startswith(("http://", "https://", "grpc://")):
                try:
                    parts = urlsplit(url)
                    port = parts.port  # raises on a port out of range or not a number
                except ValueError as exc:
                    raise ValueError(f"replica {url!r}: {exc}") from None
                if not parts.hostname:
                    raise ValueError(f"replica {url!r} names no host")
                if parts.username is not None or parts.password is not None:
                    # never sent (no Basic auth is built from it), and it would show in clear
                    # in /metrics labels, /readyz and error messages
                    raise ValueError(
                        f"replica {parts.scheme}://{parts.hostname}: a user or password in a "
                        "replica URL is not sent upstream; remove it (clients' own credential "
                        "headers go upstream as they sent them)"
                    )
                if port is None and url.startswith("grpc://"):
                    raise ValueError(f"replica {url!r} names no port")
        if len({wire_of(u) for u in value}) > 1:
            raise ValueError("a pool's replicas all speak HTTP or all speak gRPC, not both")
        return value

    @model_validator(mode="before")
    @classmethod
    def _grpc_health_path(cls, data: Any) -> Any:
        """A gRPC pool's active check is ServerReady unless the config names another RPC."""
        if not isinstance(data, dict):
            return data
        replicas, check = data.get("replicas"), data.get("health_check")
        grpc = isinstance(replicas, list) and any(
            isinstance(u, str) and wire_of(u) == "grpc" for u in replicas
        )
        if grpc and isinstance(check, dict) and "path" not in check:
            return {**data, "health_check": {**check, "path": GRPC_READY_PATH}}
        return data

    @property
    def wire(self) -> Literal["http", "grpc"]:
        return wire_of(self.replicas[0])

    @model_validator(mode="after")
    def _weights(self) -> RemoteBackendSettings:
        w = self.balancer.weights
        if w is not None and (len(w) != len(self.replicas) or min(w) <= 0):
            raise ValueError("balancer.weights needs one positive weight per replica")
        return self


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
    # Pixels (width x height, from the header) an image may declare: decoding holds ~4 bytes a
    # pixel, and a PNG of zeros compresses ~1000:1, so max_bytes alone let a 0.5 MB file take
    # 700 MB and seconds of CPU. 32 M covers a 24 MP camera; Pillow itself refuses past ~89 M.
    max_pixels: int = Field(default=32_000_000, ge=1, le=89_478_485)


PreprocessSettings = Annotated[TextPreprocess | ImagePreprocess, Field(discriminator="kind")]


class SessionOptions(_Frozen):
    graph_optimization: Literal["disable", "basic", "extended", "all"] = "all"
    intra_op_threads: int = Field(default=0, ge=0)  # 0: ONNX Runtime's default (one per core)
    inter_op_threads: int = Field(default=0, ge=0)
    # ONNX Runtime's worker threads spin between runs (its default): 0.8-2 ms off a one-sentence
    # embed on a 2-core box at 2 threads, for 15-20 % more CPU per call. A sidecar that shares
    # its cores with the application can turn it off (docs/benchmarks.md, "Third session").
    allow_spinning: bool = True


class _LocalBackend(_Frozen):
    # An ONNX file, or `builtin:all-MiniLM-L6-v2` (exported from the packaged model on first use).
    model: str
    # The name clients use: OpenAI `model` and the v2 `/v2/models/{name}`; default: from `model`.
    served_name: str | None = None
    task: Literal["embed", "tensor"] = "embed"  # tensor: v2 tensors in and out (any ONNX graph)
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
    # fp16/int8 need an artifact promoted by `latentgate build` (it checks accuracy first).
    precision: Literal["fp32", "fp16", "int8"] = "fp32"


class TensorRTBackendSettings(_LocalBackend):
    """A model compiled to a native TensorRT engine (GPU only)."""

    kind: Literal["tensorrt"] = "tensorrt"
    precision: Literal["fp32", "fp16", "int8"] = "fp16"
    # INT8: a text file (one input per line) or STS-B style .csv; the profile's maximum shape is
    # (batching.max_batch, preprocess.max_tokens).
    calibration: str | None = None


BackendSettings = Annotated[
    RemoteBackendSettings | OnnxBackendSettings | TensorRTBackendSettings,
    Field(discriminator="kind"),
]
