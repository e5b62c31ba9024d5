"""Time is injected: schedulers ask a clock, never the system, so the same class runs in the
simulator (simulated time) and in training (monotonic wall time)."""
from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds, monotonic."""


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock tests and the simulator move by hand."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def set(self, t: float) -> None:
        if t < self._now:
            raise ValueError(f"time cannot go back: {t} < {self._now}")
        self._now = t

    def advance(self, dt: float) -> None:
        self.set(self._now + dt)
