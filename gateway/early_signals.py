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
"""

from __future__ import annotations

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
