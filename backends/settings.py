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


BackendSettings = Annotated[RemoteBackendSettings, Field(discriminator="kind")]
