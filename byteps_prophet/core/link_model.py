"""Prophet's model of the link: FIFO stages, re-anchored to reality at every completion.

Each stage (push, pull; where pulls follow pushes, the pull request's wait behind the next push as
one more: docs/DESIGN.md, "Request-wait stage") serves a piece after the stage before it and after
the piece before it, for ``cost + bytes / rate``. ``lag`` is how far reality runs behind the model,
read at every completion.
"""
from __future__ import annotations

from collections import deque

from byteps_prophet.core.task import Task


class LinkModel:
    def __init__(self, stages: int, parameter_server: bool) -> None:
        self.stage_free = [0.0] * stages  # when each stage frees, in model time
        self.finishes: deque[tuple[Task, float]] = deque()  # pieces in flight, predicted finish
        self.lag = 0.0
        self._parameter_server = parameter_server

    def first_stage_lag(self) -> float:
        """How far the first stage runs behind the model. On a parameter server a piece completes only
        once every worker has pushed it, so a completion late because a peer is behind says nothing of
        this worker's own push: there only an early completion moves the first stage (docs/DESIGN.md,
        "Late peer (first-stage lag)")."""
        lag = self.lag
        return 0.0 if self._parameter_server and lag > 0 else lag

    def next_finish(self) -> float:
        return self.finishes[0][1] + self.lag if self.finishes else float("inf")

    def advance(self, piece: Task, sent: float, service: float) -> None:
        """``piece`` reaches the first stage no earlier than ``sent`` and takes ``service`` on each."""
        lag, lag0, stage_free, done = self.lag, self.first_stage_lag(), self.stage_free, sent
        for j, free in enumerate(stage_free):
            shift = lag0 if j == 0 else lag
            free += shift
            done = (free if free > done else done) + service
            stage_free[j] = done - shift
        self.finishes.append((piece, done - lag))

    def completed(self, piece: Task, now: float) -> None:
        finishes = self.finishes
        if finishes and finishes[0][0] is piece:  # the head, unless the transport reorders
            self.lag = now - finishes.popleft()[1]
            return
        for k, (sent, predicted) in enumerate(finishes):
            if sent is piece:
                self.lag = now - predicted
                del finishes[k]
                break
