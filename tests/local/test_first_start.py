"""The first start with an empty artifacts directory: the listeners open at once, /healthz is
200 and /readyz 503 with the build's progress until the engine is in, and the log says what is
built, where, and roughly how long it takes (and nothing that reads like a failure)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.support.servers import ROOT, GatewayProcess, free_port

pytestmark = pytest.mark.slow


async def test_first_start_listens_at_once_and_shows_the_build(tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    with (ROOT / "config/latentgate.yaml").open() as f:
        config = yaml.safe_load(f)  # the ${VAR} placeholders stay: the gateway interpolates them
    env = {
        "LATENTGATE_ARTIFACTS": str(artifacts),
        "LATENTGATE_ADMIN_PORT": str(free_port()),
        "LATENTGATE_GRPC_PORT": str(free_port()),
        "LATENTGATE_UPSTREAM": "http://127.0.0.1:9",
    }
    gw = GatewayProcess(config, env=env).start(semantic_ready=False)  # once the port is open
    try:
        steps: list[str] = []
        async with aiohttp.ClientSession() as s:
            async with s.get(gw.url + "/healthz") as r:
                assert r.status == 200
            deadline = time.monotonic() + 300
            while True:
                async with s.get(gw.url + "/readyz") as r:
                    body = await r.json()
                    if r.status == 200:
                        break
                assert r.status == 503 and body["ready"] is False
                load = body["backends"]["minilm"]["load"]
                steps.append(load["step"])
                if load["step"] in ("export", "fuse"):
                    assert str(artifacts) in load["detail"] and load["expected_s"] > 0
                async with s.get(gw.url + "/v2/health/ready") as r:
                    assert r.status in (200, 503)
                assert time.monotonic() < deadline, gw.log()
                await asyncio.sleep(0.2)
        assert "export" in steps, steps
        assert body["backends"]["minilm"]["load"]["step"] == "ready"
        assert body["semantic"]["ready"] is True
    finally:
        gw.stop()
    log = gw.log()
    assert log.count("first start: exporting") == 1, log
    assert str(artifacts) in log and "about" in log
    assert "Could not load library" not in log and "ModuleNotFoundError" not in log
    # The chosen device is said once.
    assert log.count("onnxruntime on cpu") == 1, log
    assert list(artifacts.glob("*/model.fp32.fused.onnx"))
