"""Cache policy and store settings (value objects; no I/O)."""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cache.semantic.rivals import RIVAL_COSINE


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KeySettings(_Frozen):
    """What goes into an exact key beyond the protocol's canonical fields."""

    # Extra credential headers (e.g. X-Tenant) on top of the built-in set that always partitions
    # the cache: Authorization, api-key, x-api-key, OpenAI-Organization, OpenAI-Project,
    # anthropic-workspace-id, anthropic-user-profile-id, Cookie, x-goog-api-key,
    # x-goog-user-project, Ocp-Apim-Subscription-Key.
    tenant_headers: list[str] = []
    ignore_fields: list[str] = []


class ExactPolicy(_Frozen):
    enabled: bool = False
    ttl: float = Field(3600.0, gt=0)
    tiers: list[Literal["memory", "redis"]] = ["memory", "redis"]
    max_entry_bytes: int = Field(1 << 20, ge=1)
    key: KeySettings = KeySettings()
    # Only calls whose answer the request determines (temperature 0 or a seed, embeddings, v2
    # infer) are answered from the cache; false also caches sampled calls (replays one sample).
    only_deterministic: bool = True
    # Identical concurrent misses share one backend call; a waiter gives up after coalesce_wait_s.
    coalesce: bool = True
    coalesce_wait_s: float = Field(30.0, gt=0)


class JudgeSettings(_Frozen):
    """`answer_match: judge`: a chat model asked "same answer? yes/no" (cache.semantic.judge):
    one of the gateway's backends, called directly (never through a route's cache), or a URL."""

    backend: str | None = None
    path: str = "/v1/chat/completions"  # on the backend
    url: str | None = None
    model: str = Field(min_length=1)
    headers: dict[str, str] = {}
    timeout: float = Field(30.0, gt=0)
    # Merged into the judge's request body; a null removes a default (e.g. max_tokens: null
    # with max_completion_tokens: 3, for models that take only that).
    body: dict[str, Any] = {}
    max_concurrent: int = Field(4, ge=1)  # verdicts in flight per route; more labels queue

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        # checked here: a URL that cannot be called would fail every label later, quietly
        parts = urlsplit(url or "")
        if url is not None and (parts.scheme not in ("http", "https") or not parts.hostname):
            raise ValueError(f"judge url must be an http(s) URL with a host, not {url!r}")
        return url

    @model_validator(mode="after")
    def _one_endpoint(self) -> JudgeSettings:
        if (self.backend is None) == (self.url is None):
            raise ValueError("a judge needs one of backend (a backend's name) or url")
        return self


MAX_HALF_LIFE_S = 10 * 365 * 86400.0  # label_half_life's ceiling: ten years

_BUDGET_ONLY = frozenset(
    {
        "audit_rate",
        "answer_match",
        "answer_cosine",
        "judge",
        "error_confidence",
        "prior",
        "label_half_life",
        "min_labels",
        "tenant_guard",
    }
)


class SemanticPolicy(_Frozen):
    enabled: bool = False
    # The cosine a candidate needs. None: the verifier's calibrated floor (stored in its trained
    # artifact with min_score), or 0.90 with the verifier off.
    threshold: float | None = Field(None, ge=-1.0, le=1.0)
    # "on" = "features" (the MLP over cosine + lexical signals, ~0.2 ms); "cross-encoder" = a
    # trained cross-encoder (cache.semantic.cross_encoder_artifact); "off" = cosine alone.
    verifier: Literal["on", "cross-encoder", "features", "off"] = "on"
    only_deterministic: bool = True
    max_entries: int = Field(100_000, ge=1)
    ttl: float = Field(3600.0, gt=0)
    min_chars: int = Field(8, ge=0)
    # Longer texts skip the stage (reason "too_long"): the embedder reads 256 tokens (~1,000
    # characters), so two long prompts sharing a start would look alike; and no request's
    # tokenising may stall the others.
    max_chars: int = Field(2048, ge=1)
    # v2 (Open Inference) routes: the BYTES input that holds the question. A request whose
    # input holds several strings (a batch) has no semantic lookup: it is not one question.
    field: str | None = None
    # With the verifier on, `threshold` is the cosine floor for candidates and this is the
    # verifier's acceptance score; None = the operating point stored in the trained artifact.
    min_score: float | None = Field(None, ge=0.0, le=1.0)
    # A candidate is not served while another stored question is this close to the asked one
    # (cache.semantic.rivals: a contested neighbourhood, where the pick is often wrong); None
    # serves the verifier's pick whatever its neighbours.
    rival_cosine: float | None = Field(RIVAL_COSINE, ge=-1.0, le=1.0)
    # Error budget (cache.semantic.budget): None = the static point above, as before. Set, the
    # route learns its bar from labels (misses with a candidate, audited hits) so that the
    # upper confidence bound of the error rate among served hits stays <= max_error_rate.
    max_error_rate: float | None = Field(None, gt=0.0, lt=1.0)
    # Share of semantic hits also sent upstream in the background to label them; doubled
    # (to at most 0.10) while the served bar has few labels. Audits never exceed 10 % of hits.
    audit_rate: float = Field(0.05, ge=0.0, le=0.10)
    answer_match: Literal["exact", "embedding", "judge"] = "exact"
    answer_cosine: float = Field(0.95, ge=-1.0, le=1.0)  # answer_match: embedding
    judge: JudgeSettings | None = None  # answer_match: judge
    # Of the one-sided bound on prior and live labels together (docs/architecture.md: 0.80,
    # with min_labels 100, chosen on the calib parts by bench.budget_crossfit; 0.95 without a
    # prior needs ~150 clean labels per region).
    error_confidence: float = Field(0.80, ge=0.5, lt=1.0)
    # Start from the shipped prior (budget_prior.npz, the development data's labels for the
    # shipped verifier); ignored with another verifier artifact than the one it was built for.
    prior: bool = True
    # Labels fade so that a change in the traffic is followed: one this many seconds old
    # weighs half (shared counts fade by wall-clock epochs of a quarter of it). Finite and at
    # most ten years: the shared counts' epochs and their hash's expiry are whole seconds
    # (an infinite one stopped the stage at start-up; 1e300 failed every flush).
    label_half_life: float = Field(86400.0, gt=0, le=MAX_HALF_LIFE_S, allow_inf_nan=False)
    min_labels: int = Field(100, ge=1)  # prior and live, in a served region before it serves
    # A tenant whose own labels refute the route's bar is served nothing semantic until they no
    # longer do (cache.semantic.tenant_guard). Off: every tenant is served at the pooled bar (a
    # route whose tenants are one application's end users, each with little traffic of its own).
    tenant_guard: bool = True

    @model_validator(mode="after")
    def _judge_needs_endpoint(self) -> SemanticPolicy:
        if self.answer_match == "judge" and self.judge is None:
            raise ValueError("answer_match 'judge' needs a judge: {backend or url, model}")
        if self.judge is not None and self.answer_match != "judge":
            raise ValueError(
                f"a judge is set but answer_match is {self.answer_match!r}: set 'judge'"
            )
        if self.max_error_rate is None:
            # these only mean something to a budget: set alone, they would do nothing, quietly
            # (a default written out, as /admin/config shows the policy, is not a mistake)
            fields = type(self).model_fields
            budget_only = {k for k in _BUDGET_ONLY if getattr(self, k) != fields[k].default}
            if budget_only:
                raise ValueError(
                    f"{', '.join(sorted(budget_only))} only apply with max_error_rate (the error "
                    "budget); set max_error_rate or remove them"
                )
        return self


class CachePolicy(_Frozen):
    """A route's cache policy slot."""

    exact: ExactPolicy = ExactPolicy()
    semantic: SemanticPolicy = SemanticPolicy()


class MemorySettings(_Frozen):
    max_bytes: int = Field(256 << 20, ge=1024)


class RedisTimeouts(_Frozen):
    connect: float = Field(0.25, gt=0)
    # Short, but above the event-loop lag of a busy worker: a timeout counts toward the breaker.
    op: float = Field(0.1, gt=0)
    admin: float = Field(10.0, gt=0)


class RedisPoolSettings(_Frozen):
    max_connections: int = Field(64, ge=1)


class RedisBreakerSettings(_Frozen):
    failures: int = Field(5, ge=1)
    open_s: float = Field(2.0, gt=0)


class RedisLeaseSettings(_Frozen):
    """Cross-process single flight: a short SET NX PX lease per key, best effort."""

    enabled: bool = True
    ttl_ms: int = Field(10_000, ge=10)
    poll_ms: int = Field(10, ge=1)


class RedisSettings(_Frozen):
    # None (e.g. an unset ${LATENTGATE_REDIS_URL:-}) means no Redis: memory only.
    # cluster/sentinel: the URL lists seed nodes / sentinels, comma-separated (cache.redis_client).
    url: str | None = None
    mode: Literal["standalone", "cluster", "sentinel"] = "standalone"
    sentinel_master: str = "mymaster"  # the primary's name in sentinel mode
    timeouts: RedisTimeouts = RedisTimeouts()
    pool: RedisPoolSettings = RedisPoolSettings()
    breaker: RedisBreakerSettings = RedisBreakerSettings()
    lease: RedisLeaseSettings = RedisLeaseSettings()
    key_prefix: str = "lg:"
    # Deletes Redis could not take yet are also written to a file, so a process stopped during
    # an outage hands them to the next one on this host (cache.tiers.delete_journal). Its
    # directory: None = $LATENTGATE_STATE_DIR, else $XDG_STATE_HOME/latentgate, else
    # ~/.local/state/latentgate.
    journal: bool = True
    journal_dir: str | None = None

    @model_validator(mode="after")
    def _usable_url(self) -> RedisSettings:
        # checked here, so check-config says it: the client refused it only at start, with a
        # traceback (a service that passed check-config then failed to start, again and again)
        if self.url:
            _check_redis_url(self.url, self.mode)
        return self


def _check_redis_url(url: str, mode: str) -> None:
    from redis.asyncio.connection import parse_url

    from cache.redis_client import parse_hosts

    schemes = ("redis", "rediss", "unix") if mode == "standalone" else ("redis", "rediss")
    scheme = urlsplit(url).scheme
    if scheme not in schemes:
        raise ValueError(
            f"redis url must start with {', '.join(s + '://' for s in schemes)}"
            f" in {mode} mode, not {scheme + '://' if scheme else 'no scheme'}"
        )
    try:
        if mode == "standalone":
            parse_url(url)
        else:
            parse_hosts(url)
    except ValueError as exc:  # a port or db that is not a number, an unknown query option
        raise ValueError(f"redis url does not parse: {exc}") from None


class SemanticIndexSettings(_Frozen):
    """Process-wide semantic stage: embedder, index, verifier artifact (policies are per route)."""

    model: str = "builtin:all-MiniLM-L6-v2"
    providers: Literal["auto", "cpu", "cuda"] = "auto"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    flat_max: int = Field(20_000, ge=1)
    hnsw_m: int = Field(32, ge=4)
    ef_search: int = Field(64, ge=1)
    # How vectors are stored: "8bit" = fp16 codes in flat shards, 8-bit scalar codes in HNSW
    # shards (see docs/benchmarks.md for memory and top-1 agreement); "fp16"; "fp32" = exact.
    quantizer: Literal["fp32", "fp16", "8bit"] = "8bit"
    # The process's semantic index (all routes) in bytes; past it the oldest entries go.
    max_bytes: int = Field(256 << 20, ge=1 << 16)
    # Concurrent lookups are embedded together: up to batch_max texts, waiting at most
    # batch_max_delay_ms; with batch_target_p95_ms set the wait adapts to the arrival rate and
    # is zero when lookups come one at a time (no latency added to a lone request).
    batch_max: int = Field(32, ge=1)
    batch_max_delay_ms: float = Field(2.0, ge=0)
    batch_target_p95_ms: float | None = Field(20.0, gt=0)
    # ONNX Runtime's worker threads for the embedder (0: one per core) and whether they spin
    # between runs (its default): spinning takes 0.8-2 ms off a lone lookup's embed on 2 cores,
    # and costs a sidecar that shares them with Redis about a fifth of its throughput under
    # load (docs/benchmarks.md, "Fourteenth session").
    intra_op_threads: int = Field(0, ge=0)
    allow_spinning: bool = True
    verifier_artifact: str | None = None  # the "features" MLP (.npz)
    # the error budget's prior (.npz from bench/budget_prior.py); None = the shipped one
    budget_prior: str | None = None
    # the cross-encoder (.npz from bench/train_cross_encoder.py); None = its default output path
    cross_encoder_artifact: str | None = None
    # ONNX Runtime threads for the cross-encoder (1: the other core stays with the event loop)
    cross_encoder_threads: int = Field(1, ge=0)
    artifacts_dir: str | None = None  # where exported ONNX models are cached
    sync: bool = True  # share through Redis when cache.redis is configured


class CacheSettings(_Frozen):
    # Keys tenant hashes (blake2b); None: $LATENTGATE_TENANT_SECRET, else generated at start
    # (shared by the workers of one server, not by other sidecars: see docs/security.md).
    tenant_secret: str | None = Field(None, repr=False)
    memory: MemorySettings = MemorySettings()
    redis: RedisSettings | None = None
    semantic: SemanticIndexSettings = SemanticIndexSettings()
