"""The first start with an empty artifacts directory: the listeners open at once, /healthz is
200 and /readyz 503 with the build's progress until the engine is in, and the log says what is
built, where, and roughly how long it takes (and nothing that reads like a failure). A stop
during the build ends it: the process does not wait the export out."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
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


def _first_start(artifacts: Path) -> GatewayProcess:
    artifacts.mkdir()
    with (ROOT / "config/latentgate.yaml").open() as f:
        config = yaml.safe_load(f)
    env = {
        "LATENTGATE_ARTIFACTS": str(artifacts),
        "LATENTGATE_ADMIN_PORT": str(free_port()),
        "LATENTGATE_GRPC_PORT": str(free_port()),
        "LATENTGATE_UPSTREAM": "http://127.0.0.1:9",
    }
    return GatewayProcess(config, env=env)


def _built(artifacts: Path) -> list[str]:
    """What a build left in the artifacts directory (its lock file aside)."""
    return sorted(p.name for p in artifacts.rglob("*") if p.is_file() and p.name != ".lock")


async def test_a_sigterm_during_the_first_start_export_ends_it(tmp_path: Path) -> None:
    """The process used to wait for its loading threads, so a SIGTERM during the export (or a
    start that failed) ended only once the whole model was built, past shutdown_grace_s."""
    artifacts = tmp_path / "artifacts"
    gw = _first_start(artifacts).start(semantic_ready=False)
    try:
        async with aiohttp.ClientSession() as s:
            deadline = time.monotonic() + 300
            while True:
                async with s.get(gw.url + "/readyz") as r:
                    if (await r.json())["backends"]["minilm"]["load"]["step"] == "export":
                        break
                assert time.monotonic() < deadline, gw.log()
                await asyncio.sleep(0.1)
    finally:
        code = gw.stop(timeout=600)  # before: after the export, however long it took
    log = gw.log()
    assert code == 0, log
    assert "stopped" in log
    # the export was ended: no model, no half-written file, no "fusion does not apply" marker
    assert _built(artifacts) == [], log
    assert "failed to load" not in log and "Traceback" not in log, log


def test_a_taken_port_on_the_first_start_is_said_without_waiting_for_the_export(
    tmp_path: Path,
) -> None:
    artifacts = tmp_path / "artifacts"
    gw = _first_start(artifacts)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", gw.port))
        taken.listen()
        proc = subprocess.run(
            [sys.executable, "-m", "gateway", "serve", "--config", gw.config_path],
            cwd=ROOT,
            env=gw.env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert f"cannot listen on http://127.0.0.1:{gw.port}" in out
    assert _built(artifacts) == [], out  # before: the model was built first, then the line
