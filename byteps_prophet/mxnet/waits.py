"""Bounded waits of an MXNet store, and the failures of its background threads.

A store's work runs on threads the caller never sees (the readiness probe, the engine's workers, the
order channel, the wakeup timer). A failure on any of them is kept, printed once, and raised on the
caller's next call; every wait of the caller ends by ``BYTEPS_PROPHET_TIMEOUT``, in TimeoutError
rather than a hang.
"""
from __future__ import annotations

import sys
import threading
import time
import traceback


class BoundedWaits:
    def __init__(self, timeout_s: float, where: str) -> None:
        """``where``: who waits, for the timeout's message (worker, scheduler)."""
        self.timeout_s, self._where = timeout_s, where
        self.error: BaseException | None = None

    def fail(self, err: BaseException) -> None:
        """A background thread failed: kept (the first only) for the caller's next call."""
        if self.error is None:
            self.error = err
            traceback.print_exception(err, file=sys.stderr)

    def raise_error(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"ScheduledKVStore: background thread failed: {self.error!r}") from self.error

    def wait(self, event: threading.Event, deadline: float | None = None) -> None:
        """Wait for ``event``, at most until ``deadline`` (default: the timeout from now)."""
        if deadline is None:
            deadline = time.monotonic() + self.timeout_s
        while not event.wait(0.5):
            self.raise_error()
            if time.monotonic() > deadline:
                raise TimeoutError(f"ScheduledKVStore: synchronisation did not finish in time ({self._where}; "
                                   f"BYTEPS_PROPHET_TIMEOUT={self.timeout_s:g}s)")
        self.raise_error()
