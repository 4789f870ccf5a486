"""Build backend objects by kind from settings (a name → implementation table)."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry

from backends.base import Backend
from backends.remote.metrics import RemoteMetrics
from backends.remote.pool import Pool
from backends.settings import BackendSettings, RemoteBackendSettings


def build_backends(
    settings: Mapping[str, BackendSettings], registry: CollectorRegistry | None = None
) -> dict[str, Backend]:
    out: dict[str, Backend] = {}
    remote_metrics = RemoteMetrics(registry)
    for name, spec in settings.items():
        if isinstance(spec, RemoteBackendSettings):
            out[name] = Pool(name, spec, remote_metrics)
    return out
