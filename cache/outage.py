"""Log a dependency's failures once per state change, never once per request.

During a Redis outage every request that touches Redis fails the same way; a warning per failure
buried the logs (959 lines in 14 s). `OutageLog` says "failing" at the first failure after a
success and "recovered" (with how many failed meanwhile) at the first success after failures;
the failures themselves are counted by the caller's Prometheus counter.
"""

from __future__ import annotations

import logging


class OutageLog:
    def __init__(self, logger: logging.Logger, what: str, counter_hint: str) -> None:
        self._log = logger
        self.what = what
        self.counter_hint = counter_hint  # where /metrics counts the failures
        self.failing = False
        self.failures = 0

    def failed(self, detail: object, n: int = 1) -> None:
        """n failures at once (a batch that failed together)."""
        self.failures += n
        if not self.failing:
            self.failing = True
            self._log.warning(
                "%s failing (%s); further failures are counted in %s, not logged",
                self.what,
                detail,
                self.counter_hint,
            )

    def count(self) -> None:
        """A failure that does not by itself change the state (e.g. before a breaker opens)."""
        if self.failing:
            self.failures += 1

    def ok(self) -> None:
        if self.failing:
            self._log.warning("%s recovered after %d failures", self.what, self.failures)
            self.failing = False
            self.failures = 0
