"""Build backend objects by kind from settings (a name → implementation table)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from backends.base import Backend
from backends.remote.metrics import RemoteMetrics
from backends.remote.pool import Pool
from backends.settings import ANSWER_CAP, BackendSettings, RemoteBackendSettings

if TYPE_CHECKING:
    from backends.local.metrics import LocalMetrics
    from backends.local.shared import EngineShare


def preflight(settings: Mapping[str, BackendSettings]) -> list[str]:
    """Problems that would stop a backend from starting (e.g. tensorrt absent), one line each."""
    from backends.local.backend import preflight as local_preflight

    problems = []
    for name, spec in settings.items():
        if not isinstance(spec, RemoteBackendSettings):
            problem = local_preflight(name, spec)
            if problem is not None:
                problems.append(problem)
    return problems


def build_backends(
    settings: Mapping[str, BackendSettings],
    registry: CollectorRegistry | None = None,
    remote_metrics: RemoteMetrics | None = None,
    local_metrics: LocalMetrics | None = None,
    engines: EngineShare | None = None,
    answer_cap: int = ANSWER_CAP,
) -> dict[str, Backend]:
    """Raises EngineError (with preflight's message) when a local backend cannot start here.
    `remote_metrics`, `local_metrics`: the app's sets when building again (a reload), since
    metric names are unique per registry. `answer_cap`: the largest reply a gRPC replica may
    send (the gateway's limits.max_body_bytes)."""
    local: dict[str, Backend] = {}
    for name, spec in settings.items():
        if isinstance(spec, RemoteBackendSettings):
            continue
        from backends.local.backend import LocalBackend
        from backends.local.metrics import LocalMetrics

        if local_metrics is None:
            local_metrics = LocalMetrics(registry if registry is not None else CollectorRegistry())
        local[name] = LocalBackend(name, spec, local_metrics, engines)
    # The pools after the local backends, whose preflight may raise: a pool opens its sessions
    # when built, and a raise after it left them open for good (nothing held the pool to close).
    remote_metrics = remote_metrics or RemoteMetrics(registry)
    out: dict[str, Backend] = {}
    for name, spec in settings.items():
        if isinstance(spec, RemoteBackendSettings):
            out[name] = Pool(name, spec, remote_metrics, answer_cap=answer_cap)
        else:
            out[name] = local[name]
    return out
