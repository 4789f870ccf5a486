"""The server process as an operator's supervisor sees it: start-up failures in one line with a
distinct exit code, and a worker's death said aloud and reflected in the exit code."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.conftest import base_config
from tests.support.fork_hold import GATED, signal_each_worker_at_birth
from tests.support.servers import ROOT, GatewayProcess, ServerThread


def test_a_taken_port_is_one_line_and_exit_code_2(upstream: ServerThread, tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        cfg = base_config(upstream.url)
        cfg["listeners"] = [{"name": "main", "host": "127.0.0.1", "port": port}]
        path = tmp_path / "lg.yaml"
        path.write_text(yaml.safe_dump(cfg))
        proc = subprocess.run(
            [sys.executable, "-m", "gateway", "serve", "--config", str(path)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
            check=False,
        )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"cannot listen on http://127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(x) for x in text.split()]


def test_a_killed_worker_is_logged_and_the_exit_code_says_so(
    upstream: ServerThread, gateway_process: Callable[..., GatewayProcess]
) -> None:
    gw = gateway_process(base_config(upstream.url), workers=2)
    assert gw.proc is not None
    workers = _children(gw.proc.pid)
    assert len(workers) == 2
    os.kill(workers[0], signal.SIGKILL)
    deadline = time.monotonic() + 30
    said = f"worker {workers[0]} ended (killed by signal 9); 1 still serving"
    while said not in gw.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert said in gw.log()
    assert gw.stop() == 1  # the survivor drained cleanly; one worker did not


def test_a_worker_that_missed_the_stop_ends_on_the_parents_repeat(
    upstream: ServerThread, gateway_process: Callable[..., GatewayProcess]
) -> None:
    """A stop lost on its way into a worker leaves it serving, and the server never ends (seen
    under load, before early_signals.fork). The parent repeats it each second as SIGURG until
    every worker has ended: the repeat alone stops a worker, which ends cleanly."""
    from gateway.server import STOP_REPEAT

    gw = gateway_process(base_config(upstream.url), workers=2)
    assert gw.proc is not None
    workers = _children(gw.proc.pid)
    assert len(workers) == 2
    os.kill(workers[0], STOP_REPEAT)  # the repeat alone is a stop for a worker
    deadline = time.monotonic() + 30
    while _children(gw.proc.pid) != workers[1:] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _children(gw.proc.pid) == workers[1:], gw.log()
    assert f"[{workers[0]}] draining" in gw.log()
    assert f"worker {workers[0]} ended" not in gw.log()  # (said only of an unclean end)
    gw.proc.send_signal(signal.SIGTERM)
    assert gw.proc.wait(60) == 0, gw.log()


def test_a_stop_while_the_workers_start_is_a_clean_stop(upstream: ServerThread) -> None:
    """`systemctl stop` right after a start: a SIGTERM that reached a worker still building its
    app used to kill it (its default action), and the server exited 1 ("killed by signal 15"),
    so a supervisor's Restart=on-failure restarted what it had been told to stop. Remembered, it
    is the usual drain once the worker's handlers are in, and the exit code is 0."""
    gw = GatewayProcess(base_config(upstream.url), workers=2)
    gw._log = open(gw.log_path, "wb")  # noqa: SIM115 - closed by stop()
    gw.proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--config", gw.config_path, "--workers", "2"],
        cwd=ROOT,
        env=gw.env,
        stdout=gw._log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while "started 2 workers" not in gw.log() and time.monotonic() < deadline:
        time.sleep(0.005)
    gw.proc.send_signal(signal.SIGTERM)  # the workers are still building their apps
    assert gw.proc.wait(60) == 0, gw.log()
    assert "killed by signal" not in gw.log()
    assert gw.log().count("stopped") == 2, gw.log()
    gw.stop()


def test_a_stop_that_reaches_a_worker_before_it_ran_is_kept(upstream: ServerThread) -> None:
    """A worker the scheduler had not run yet when the parent forwarded a stop (1 in 8 under load
    on a fresh-clone CI run) got the SIGTERM before os.fork had returned in it, and CPython's
    after-fork step cleared it: the worker served on and the server never ended. Each worker
    here gets its SIGTERM held at its birth (before its first instruction); each must drain,
    and the server end with exit code 0. The parent is never told to stop: no repeat helps."""
    gw = GatewayProcess(base_config(upstream.url), workers=2)
    gw._log = open(gw.log_path, "wb")  # noqa: SIM115 - closed by stop()
    serve = ["-m", "gateway", "serve", "--config", gw.config_path, "--workers", "2"]
    gw.proc = subprocess.Popen(
        [sys.executable, "-c", GATED, *serve],
        cwd=ROOT,
        env=gw.env,
        stdin=subprocess.PIPE,
        stdout=gw._log,
        stderr=subprocess.STDOUT,
    )
    try:
        workers = signal_each_worker_at_birth(gw.proc, 2, signal.SIGTERM)
        assert gw.proc.wait(60) == 0, gw.log()
        for worker in workers:
            assert f"[{worker}] draining" in gw.log()
        assert gw.log().count("stopped") == 2, gw.log()
    finally:
        gw.stop()


def _running(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in status  # a zombie has ended (its reaper may be slow)


def test_workers_drain_and_end_when_the_parent_is_killed(
    upstream: ServerThread, gateway_process: Callable[..., GatewayProcess]
) -> None:
    """The parent SIGKILLed (the OOM killer, `kill -9`): before, its workers went on serving the
    port as orphans, on their config, beside whatever was started next. Now each gets SIGTERM
    from the kernel (PR_SET_PDEATHSIG), drains and ends."""
    gw = gateway_process(base_config(upstream.url), workers=2)
    assert gw.proc is not None
    workers = _children(gw.proc.pid)
    assert len(workers) == 2
    gw.proc.kill()
    gw.proc.wait(10)
    deadline = time.monotonic() + 60
    while any(_running(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_running(w) for w in workers), gw.log()
    assert gw.log().count("stopped") == 2, gw.log()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", gw.port), timeout=5).close()
