"""A signal that reaches a forked worker before it has run any code of its own, made certain.

A worker the scheduler has not run yet when its parent forwards a signal gets it this way: under
load, now and then. Here Linux's ptrace holds each child at its birth (the kernel stops it
before its first instruction), the signal is sent while it is held, and the child is let go.
"""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess

import pytest

_PTRACE_CONT = 7
_PTRACE_DETACH = 17
_PTRACE_GETEVENTMSG = 0x4201
_PTRACE_SEIZE = 0x4206
_PTRACE_O_TRACEFORK = 0x02
_PTRACE_O_TRACEEXEC = 0x10
_PTRACE_EVENT_FORK = 1
_WALL = 0x40000000  # wait for a traced process that is not the tracer's own child too

# `python -c GATED ARGS...` is `python ARGS...` once a byte arrives on its stdin: the tracer is
# in place before the command starts, so none of its forks comes before the tracer.
GATED = (
    "import os, sys; sys.stdin.buffer.read(1); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


class _Ptrace:
    def __init__(self) -> None:
        self._call = ctypes.CDLL(None, use_errno=True).ptrace
        self._call.restype = ctypes.c_long
        self._call.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]

    def __call__(self, request: int, pid: int, data: int | ctypes.c_ulong = 0) -> None:
        arg = ctypes.byref(data) if isinstance(data, ctypes.c_ulong) else data
        if self._call(request, pid, None, arg) == -1:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))


def signal_each_worker_at_birth(
    proc: subprocess.Popen[bytes], workers: int, signum: int
) -> list[int]:
    """proc: `python -c GATED ...`, its stdin a pipe. Releases it traced, sends `signum` to each
    of its first `workers` children while the kernel holds it at its birth, and lets go of the
    process after the last; returns the children's pids."""
    assert proc.stdin is not None
    ptrace = _Ptrace()
    try:
        ptrace(_PTRACE_SEIZE, proc.pid, _PTRACE_O_TRACEFORK | _PTRACE_O_TRACEEXEC)
    except OSError as exc:  # a sandbox without ptrace (seccomp, no CAP_SYS_PTRACE)
        if exc.errno in (errno.EPERM, errno.ENOSYS):
            proc.kill()
            pytest.skip(f"ptrace is not permitted here: {exc}")
        raise
    proc.stdin.write(b"go")
    proc.stdin.close()
    born: list[int] = []
    while True:
        _, status = os.waitpid(proc.pid, _WALL)
        assert os.WIFSTOPPED(status), f"the process ended before its workers were born: {status}"
        if status >> 16 == _PTRACE_EVENT_FORK:
            child = ctypes.c_ulong()
            ptrace(_PTRACE_GETEVENTMSG, proc.pid, child)
            _, held = os.waitpid(child.value, _WALL)  # its stop at birth: no code run yet
            assert os.WIFSTOPPED(held), held
            os.kill(child.value, signum)  # pending while it is held
            ptrace(_PTRACE_DETACH, child.value)
            born.append(child.value)
            if len(born) == workers:
                ptrace(_PTRACE_DETACH, proc.pid)
                return born
            ptrace(_PTRACE_CONT, proc.pid)
        elif status >> 16:  # the exec, or a group stop: nothing to pass on
            ptrace(_PTRACE_CONT, proc.pid)
        else:  # a signal on its way in: delivered as it would have been
            ptrace(_PTRACE_CONT, proc.pid, os.WSTOPSIG(status))
