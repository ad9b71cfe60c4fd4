"""A worker's circuit breaker. When the worker itself keeps failing (its model file
is corrupt, it runs out of memory), it stops taking work, reports itself unhealthy,
and probes again after a backoff that doubles each time, so the batch's work goes to
healthy workers and no request is failed because of one sick machine."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

FAILURES_TO_OPEN = 3
FIRST_BACKOFF_S = 5.0
MAX_BACKOFF_S = 300.0


class Breaker:
    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.consecutive_failures = 0
        self.opened = 0  # times it opened since the last success: sets the backoff
        self.open_until: float | None = None
        self.last_error = ""

    @property
    def state(self) -> str:
        if self.open_until is None:
            return "closed"
        return "open" if self.clock() < self.open_until else "half-open"

    def record_failure(self, error: str) -> None:
        self.consecutive_failures += 1
        self.last_error = error
        if self.state == "half-open" or self.consecutive_failures >= FAILURES_TO_OPEN:
            self.opened += 1
            backoff = min(FIRST_BACKOFF_S * 2 ** (self.opened - 1), MAX_BACKOFF_S)
            self.open_until = self.clock() + backoff

    def record_success(self) -> None:
        self.consecutive_failures = 0
        self.opened = 0
        self.open_until = None
        self.last_error = ""

    def wait_until_probe(self, stop: threading.Event) -> None:
        """Sleep while open (a stop request wakes it); afterwards one job is the probe."""
        if self.open_until is not None:
            stop.wait(max(0.0, self.open_until - self.clock()))
