"""cache.semantic.intra_op_threads / allow_spinning reach the embedder's ONNX Runtime session:
a sidecar that shares its cores with Redis can stop the embedder's threads spinning between
runs (docs/benchmarks.md, fourteenth session). Before, only a local backend had the knob."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from cache.semantic.setup import build_semantic
from gateway.config import Settings
from tests.semantic.test_gateway import semantic_config


def _session(setup: Any) -> Any:
    engine = setup.stage.embedder._enc.engine
    engine = getattr(engine, "inner", engine)  # (a SharedEngine wraps the OrtEngine)
    return engine._sess.get_session_options()


async def test_the_embedders_session_takes_the_semantic_settings() -> None:
    for spin, threads in ((False, 1), (True, 0)):
        cfg = semantic_config("http://127.0.0.1:9")
        cfg.setdefault("cache", {})["semantic"] = {
            "allow_spinning": spin,
            "intra_op_threads": threads,
        }
        settings = Settings.model_validate(cfg)
        setup = build_semantic(settings.cache, CollectorRegistry(), settings.routes)
        assert setup is not None
        try:
            await setup.open()
            so = _session(setup)
            assert so.get_session_config_entry("session.intra_op.allow_spinning") == str(int(spin))
            assert so.intra_op_num_threads == threads
        finally:
            await setup.aclose()
