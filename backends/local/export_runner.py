"""Building one artifact file in a child process and putting it in place.

Under a file lock (one builder per folder, across processes), into a private temp file that is
synced, stamped and renamed: no reader sees a partial file, and a build that fails or is
killed leaves nothing a later start would load or keep. The child side (`die_with_parent`)
ends a build whose server was killed, which would otherwise run on as an orphan.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from backends.errors import EngineError
from backends.local.progress import LoadProgress
from backends.local.stamps import stamp_problem, write_stamp

log = logging.getLogger("latentgate.local")

# A child's exit status for "this build does not apply to this model" (no attention to fuse):
# a lasting answer, unlike a crash, a kill or a full disk.
NOT_APPLICABLE = 3
# The server's pid, for the child to check it was not orphaned before it asked to die with it.
PARENT_ENV = "LATENTGATE_BUILD_PARENT"
_PR_SET_PDEATHSIG = 1


class ExportFailed(EngineError):
    def __init__(self, message: str, returncode: int | None) -> None:
        super().__init__(message)
        self.returncode = returncode


def usable(path: Path, source: str | None = None) -> bool:
    return path.exists() and stamp_problem(path, source) is None


def run_export(
    module_args: list[str],
    out: Path,
    what: str,
    announce: Callable[[], None] | None = None,
    source: str = "",
    progress: LoadProgress | None = None,
) -> bool:
    """`python -m MODULE ARGS... TMP`, then TMP → `out`: once per file, under a file lock, in a
    child process (torch stays out of the serving process). False when another process built
    `out` while this one waited. `announce` runs only when this call builds (one log line).
    `source` (the model's hash) goes in the stamp. A stopped `progress` ends the child and
    raises LoadStopped, leaving nothing behind. Raises ExportFailed (or OSError: a read-only
    or full directory)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with (out.parent / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if progress is not None:
            progress.check()  # (a stop while this waited for another loader's build)
        if out.exists():
            problem = stamp_problem(out)
            if problem is None:
                return False
            log.warning("artifact %s %s: building it again", out, problem)
        _remove_leftovers(out)
        if announce is not None:
            announce()
        tmp = out.with_suffix(f".tmp{os.getpid()}")
        try:
            returncode, stdout, stderr = _run_child([*module_args, str(tmp)], progress)
            if progress is not None and returncode != 0:
                progress.check()  # ended by the stop, not failed: nothing to report or mark
            if returncode != 0 or not tmp.exists():
                tail = (stderr or stdout).strip().splitlines()[-5:]
                raise ExportFailed(f"{what} failed: " + " | ".join(tail), returncode)
            _sync(tmp)
            write_stamp(out, tmp.stat().st_size, source)
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)  # a failed build's partial file (on a full disk: space)
        with contextlib.suppress(OSError):
            _sync(out.parent)
        return True


def _run_child(args: list[str], progress: LoadProgress | None) -> tuple[int, str, str]:
    child = subprocess.Popen(
        [sys.executable, "-m", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
             PARENT_ENV: str(os.getpid())},
    )  # fmt: skip
    if progress is not None:
        progress.adopt(child)
    try:
        stdout, stderr = child.communicate()
    finally:
        if progress is not None:
            progress.adopt(None)
    return child.returncode, stdout, stderr


def _remove_leftovers(out: Path) -> None:
    """Temp files of builds that died (a killed server's): nobody renames them, and each holds
    up to a whole model's worth of disk. Only called under the lock, so none is being written
    by a live build."""
    own = re.compile(re.escape(out.stem) + r"\.tmp\d+")
    for leftover in out.parent.glob(f"{out.stem}.tmp*"):
        if own.fullmatch(leftover.name):
            with contextlib.suppress(OSError):
                leftover.unlink()


def _sync(path: Path) -> None:
    """The file's (or folder's) blocks on disk before the rename publishes it: otherwise a
    crash right after could leave the final name on a short or empty file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def die_with_parent() -> None:
    """Called first in a build's child process: the kernel kills it when the server that
    started it dies (Linux; elsewhere a killed server's build runs to its end, unused)."""
    parent = os.environ.get(PARENT_ENV)
    if parent is None:
        return  # run by hand
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != int(parent):
        os._exit(1)  # the server died before the line above could take effect
