"""Artifacts that a crash, a kill or a full disk damaged: a file cut short is built again
instead of loaded, a fusion that was killed is tried again (not marked as not applying), and a
server killed mid-fusion leaves no temp file behind once the next start has built."""

from __future__ import annotations

import os
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from backends.local.artifacts import builtin_dir, fused, resolve
from gateway.app import build_app
from gateway.codings import SERVER_OPTIONS
from gateway.config import Settings
from tests.local.conftest import http, local_config, wait_ready
from tests.support.servers import GatewayProcess, ServerThread

pytestmark = pytest.mark.slow

MODEL = "builtin:all-MiniLM-L6-v2"
CONFIG = builtin_dir("all-MiniLM-L6-v2") / "config.json"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An artifacts directory this version built (export and fusion, with their stamps)."""
    art = tmp_path_factory.mktemp("built")
    resolve(MODEL, str(art))
    return art


def _copy(built: Path, tmp_path: Path) -> tuple[Path, Path]:
    art = Path(shutil.copytree(built, tmp_path / "art"))
    (folder,) = art.iterdir()
    return art, folder


def _child(parent: psutil.Process, module: str) -> psutil.Process:
    deadline = time.monotonic() + 120  # a hang guard: the child starts within a second or two
    while True:
        for child in parent.children(recursive=True):
            try:
                if module in child.cmdline():
                    return child
            except psutil.NoSuchProcess:
                continue
        assert time.monotonic() < deadline, f"no {module} child appeared"
        time.sleep(0.05)


def test_artifacts_cut_short_are_built_again_and_served(built: Path, tmp_path: Path) -> None:
    art, folder = _copy(built, tmp_path)
    sizes = {}
    for name in ("model.fp32.onnx", "model.fp32.fused.onnx"):
        path = folder / name
        sizes[name] = path.stat().st_size
        os.truncate(path, sizes[name] // 2)  # what a copy onto a full disk leaves
    settings = Settings.model_validate(local_config(artifacts_dir=str(art)))
    server = ServerThread(lambda: build_app(settings), runner_kwargs=SERVER_OPTIONS).start()
    try:
        wait_ready(server.url)
        status, body = http("POST", server.url + "/v1/embeddings",
                            {"model": "all-MiniLM-L6-v2", "input": "hello"})  # fmt: skip
        assert status == 200, body
        assert len(body["data"][0]["embedding"]) == 384
    finally:
        server.stop()
    assert {n: (folder / n).stat().st_size for n in sizes} == sizes


def test_a_killed_fusion_is_tried_again_at_the_next_start(built: Path, tmp_path: Path) -> None:
    _, folder = _copy(built, tmp_path)
    (folder / "model.fp32.fused.onnx").unlink()
    (folder / "model.fp32.fused.onnx.stamp").unlink(missing_ok=True)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(fused, folder / "model.fp32.onnx", CONFIG)
        _child(psutil.Process(), "backends.local.fuse").kill()  # the OOM killer, say
        assert first.result() is None  # served unfused this time
    assert not (folder / "model.fp32.fused.skipped").exists()
    assert not list(folder.glob("*.tmp*"))
    again = fused(folder / "model.fp32.onnx", CONFIG)
    assert again == folder / "model.fp32.fused.onnx" and again.is_file()


def test_a_server_killed_mid_fusion_leaves_no_temp_file_after_the_next_start(
    built: Path, tmp_path: Path
) -> None:
    art, folder = _copy(built, tmp_path)
    (folder / "model.fp32.fused.onnx").unlink()
    gw = GatewayProcess(local_config(artifacts_dir=str(art))).start(semantic_ready=False)
    try:
        assert gw.proc is not None
        child = _child(psutil.Process(gw.proc.pid), "backends.local.fuse")
        gw.proc.send_signal(signal.SIGKILL)
        gw.proc.wait(30)
        psutil.wait_procs([child], timeout=120)  # (a hang guard)
        assert not child.is_running(), "the fusion outlived its server"
    finally:
        gw.stop()
    artifact = resolve(MODEL, str(art))  # the next start
    assert artifact.fused_path is not None and artifact.fused_path.is_file()
    left = sorted(p.name for p in folder.glob("*.tmp*"))
    assert left == [], left  # a killed fusion's file is ~90 MB of disk each time
