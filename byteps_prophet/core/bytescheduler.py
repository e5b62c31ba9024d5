"""Stock ByteScheduler (SOSP'19): priority + partition + credit, as docs/ALGORITHMS.md section 2 states it.

Ready gradients are cut into partitions of at most ``partition`` elements and queued by priority
(index * 1000 + partition number; ties broken by arrival order, never by comparing tasks). The
dispatcher pops the most urgent partition while the credit (elements) is positive and subtracts its
full size, so at most one partition overdraws it; a completion gives its size back, up to the limit.
With ``credit_tuning`` the limit is tuned online by Bayesian optimisation over measured step times.
"""
from __future__ import annotations

import heapq
import itertools

from byteps_prophet.core.scheduler import Scheduler
from byteps_prophet.core.task import Task
from byteps_prophet.core.tuning import ALLREDUCE_BOUNDS, PS_BOUNDS, CreditTuner


class ByteScheduler(Scheduler):
    name = "bytescheduler"
    tuning_steps_per_probe = 10  # steps timed per credit probed (the original times about 100)

    def __init__(self, settings, clock, transport, on_done=None, monitor=None) -> None:
        super().__init__(settings, clock, transport, on_done, monitor)
        self.credit_limit = settings.credit
        self.credit = settings.credit
        self._queue: list[tuple[int, int, Task]] = []
        self.pending_bytes = 0  # bytes waiting in the queue
        self._sequence = itertools.count()
        self._iteration_starts: list[float] = []
        self._current_iteration: int | None = None
        self.tuner = None
        if settings.credit_tuning:
            bounds = PS_BOUNDS if self.traits.is_parameter_server else ALLREDUCE_BOUNDS
            self.tuner = CreditTuner(bounds)
            self.set_credit(self.tuner.suggest())

    # -- queue ---------------------------------------------------------------------------------------
    def _enqueue(self, piece: Task) -> None:
        heapq.heappush(self._queue, (piece.priority, next(self._sequence), piece))
        self.pending_bytes += piece.nbytes

    def _peek(self) -> Task | None:
        return self._queue[0][2] if self._queue else None

    def _pop(self) -> Task:
        piece = heapq.heappop(self._queue)[2]
        self.pending_bytes -= piece.nbytes
        return piece

    # -- events --------------------------------------------------------------------------------------
    def _on_ready(self, task: Task) -> None:
        self._note_iteration(task)
        for piece in task.partition(self.settings.partition):
            self._enqueue(piece)

    def _on_finished(self, piece: Task) -> None:
        self.credit = min(self.credit + piece.numel, self.credit_limit)

    def _dispatch(self) -> None:
        self._dispatch_under_credit()

    def _dispatch_under_credit(self) -> None:
        while self._queue and self.credit > 0:
            piece = self._pop()
            self.credit -= piece.numel
            self._start(piece)

    def set_credit(self, limit: int) -> None:
        """Change the credit limit; what is in flight stays charged against it."""
        self.credit += limit - self.credit_limit
        self.credit_limit = limit

    # -- online tuning -------------------------------------------------------------------------------
    def _note_iteration(self, task: Task) -> None:
        if task.iteration == self._current_iteration:
            return
        self._current_iteration = task.iteration
        self._iteration_starts.append(self.clock.now())
        if self.tuner is None or self.tuner.done:
            return
        if len(self._iteration_starts) > self.tuning_steps_per_probe:
            starts = self._iteration_starts
            mean_step = (starts[-1] - starts[0]) / (len(starts) - 1)
            self.tuner.observe(self.credit_limit, mean_step)
            self.set_credit(self.tuner.suggest())
            self._iteration_starts = [starts[-1]]
