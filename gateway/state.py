"""Typed application state: every long-lived object the app factory builds, in one place."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from aiohttp import web

from backends import Backend
from cache import Cache, SemanticSetup
from gateway.config import Settings
from gateway.metrics import Metrics
from gateway.pipeline import Pipeline
from gateway.worker_metrics import WorkerMetrics


@dataclass
class AppState:
    settings: Settings
    metrics: Metrics
    backends: Mapping[str, Backend]
    pipeline: Pipeline
    draining: bool = False
    cache: Cache | None = None
    semantic: SemanticSetup | None = None  # loads in the background; None when no route uses it
    # With --workers N: signals every worker (through the parent, which forwards it), so that an
    # admin call one worker took reaches the others. None in a single process.
    tell_workers: Callable[[int], None] | None = None
    # With --workers N: /metrics gathers every worker's series (gateway/worker_metrics.py).
    worker_metrics: WorkerMetrics | None = None


STATE: web.AppKey[AppState] = web.AppKey("latentgate_state", AppState)
