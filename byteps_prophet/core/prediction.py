"""Prophet's prediction: when this iteration's gradients will be ready, from the profiled pattern.

Derived once per profile (the gradients in predicted ready order, their offsets, the bytes still to
come after each), then followed through the iteration: each arrival moves the *pace* (observed over
predicted progress through backward) and the next gradient not yet arrived.
"""
from __future__ import annotations

from byteps_prophet.core.ready_pattern import StepProfile

PACE_LIMITS = (0.5, 2.0)


class StepPrediction:
    def __init__(self) -> None:
        self.derived_from: StepProfile | None = None
        self.order: list[int] = []  # gradients by predicted ready offset
        self.offsets: list[float] = []  # those offsets, in that order
        self.span = 0.0  # predicted first arrival to end of backward
        self.bytes_from: list[int] = [0]  # per position in ``order``: bytes of it and later arrivals
        self.first_ready = 0.0
        self.pace = 1.0
        self.upcoming = 0  # position in ``order`` of the next gradient not yet arrived
        self.arrived: set[int] = set()

    def derive(self, plan: StepProfile, sizes: dict[int, int]) -> None:
        """The plan's order and offsets, and the bytes still to arrive before the end of backward by
        position (the arrival at the end itself, gradient 0's, left out); once per profile."""
        if plan is self.derived_from:
            return
        offsets = plan.offsets
        self.order = sorted(offsets, key=lambda i: (offsets[i], -i))
        self.offsets = [offsets[i] for i in self.order]
        self.span = plan.span
        self.derived_from = plan
        total = 0
        self.bytes_from = [0] * (len(self.order) + 1)
        for k in range(len(self.order) - 2, -1, -1):
            total += sizes.get(self.order[k], 0)
            self.bytes_from[k] = total

    def begin(self, now: float) -> None:
        self.first_ready, self.pace, self.upcoming = now, 1.0, 0
        self.arrived = set()

    def follow(self, index: int, now: float) -> None:
        """Gradient ``index`` arrived at ``now``: the pace and the next gradient to come."""
        predicted = self.derived_from.offsets.get(index)
        if predicted is not None and predicted > 0.1 * self.span:
            self.pace = min(max((now - self.first_ready) / predicted, PACE_LIMITS[0]), PACE_LIMITS[1])
        order, arrived, upcoming = self.order, self.arrived, self.upcoming
        while upcoming < len(order) and order[upcoming] in arrived:
            upcoming += 1
        self.upcoming = upcoming

    def next_ready(self) -> float | None:
        if self.upcoming >= len(self.order):
            return None
        return self.first_ready + self.pace * self.offsets[self.upcoming]

    def end(self) -> float:
        """The predicted end of backward."""
        return self.first_ready + self.pace * self.span

    def bytes_to_come(self) -> int:
        return self.bytes_from[self.upcoming]

    def backlog_at_end(self, rate: float, sizes: dict[int, int]) -> float:
        """Bytes still queued at the predicted end of backward when the predicted arrivals (gradient
        0's left out) are served in arrival order at ``rate``."""
        free = 0.0
        for index, offset in zip(self.order[:-1], self.offsets):
            free = (free if free > offset else offset) + sizes.get(index, 0) / rate
        return (free - self.span) * rate
