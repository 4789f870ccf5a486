"""Signals that arrive before the gateway can act on them.

SIGHUP's and SIGUSR1's default action ends a process: one that arrives while the gateway still
starts (a `systemctl reload` right after a start) is remembered instead, from the moment the
`serve` command has parsed its flags, and acted on once the handlers are in (gateway.server:
a reload, or dropping the memory tier in a worker). SIGTERM and SIGINT too: a stop that reaches
a worker still building its app used to kill it (the default action), so the server exited 1
("worker ... killed by signal 15") and a supervisor's Restart=on-failure restarted what it had
been told to stop; remembered, it is the usual drain once the handlers are in (nothing is in
flight yet), and the server exits 0. No imports beyond the standard library, so
the window before this is in place stays the interpreter's own start-up.

`fork` keeps them across a worker's birth (see there).
"""

from __future__ import annotations

import os
import signal

EARLY = (signal.SIGHUP, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)


def remember_early() -> list[int]:
    """Install the remembering handlers; the list fills as those signals arrive."""
    early: list[int] = []

    def remember(signum: int, _frame: object) -> None:
        early.append(signum)

    for sig in EARLY:
        signal.signal(sig, remember)
    return early


def fork() -> int:
    """os.fork, with none of those signals lost in the child's first instant.

    A signal sent to a child that has not run yet (the parent forwarding a stop right after the
    fork) is delivered as the child leaves the kernel, before os.fork returns in it: the handler
    above is only marked to run, and CPython's after-fork step in the child then clears every
    such mark (it must: a signal the parent received just before the fork would otherwise be
    handled twice). The worker never saw the stop and served on. Blocked across the fork, the
    signal stays pending in the kernel and is delivered when the mask is restored, after that
    step: then the handler runs and the signal is remembered.
    """
    held = signal.pthread_sigmask(signal.SIG_BLOCK, EARLY)
    try:
        return os.fork()
    finally:  # in both processes (the child inherited the blocked mask)
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
