"""The scheduler contract, and FIFO (what frameworks do by default).

A scheduler is an event-driven state machine. Plugins and the simulator call it with three events:

* ``post(task)``: a whole gradient is ready (the timing probe fired);
* ``finished(slice)``: the backend finished synchronising a slice the scheduler started;
* ``end_of_backward(iteration)``: the backward pass is over, no more gradients this iteration.

and, between iterations, ``renumber(index_of)`` where a transport learns its gradients' forward order
only after training began (the MXNet store: the Trainer numbers keys by sorted name).

It answers by calling ``transport.send(slice)`` for each slice it starts, and ``on_done(task)`` when
every row of a gradient is synchronised (so the parameter can be updated). It owns no thread and
reads time only from its injected clock; callers serialise calls (one lock in the plugins, one
event loop in the simulator). ``transport.send`` may call ``finished`` before returning.

A scheduler that holds pieces for a coming event (Prophet) may also ask for a timer: it calls
``on_wakeup(t)``, which the caller sets (a plugin's ``WakeupTimer`` thread, the simulator's event
loop), and the caller then calls ``tick()`` at clock time ``t``, whatever else happened meanwhile.
Without ``on_wakeup`` (None) the scheduler just waits for its next event.
"""
from __future__ import annotations

from typing import Callable, Protocol

from byteps_prophet.core.bandwidth import BandwidthMonitor
from byteps_prophet.core.clock import Clock
from byteps_prophet.core.traits import EngineTraits
from byteps_prophet.core.settings import Settings
from byteps_prophet.core.task import Fused, State, Task


class Transport(Protocol):
    traits: EngineTraits  # what the engine behind it is like, fixed at its construction
    # Optional (absent: False): the transport carries a ``Fused`` of several pieces as one message (one
    # collective) and reports it back whole with ``finished``; Prophet fuses only for such a transport.
    accepts_fused: bool

    def send(self, task: Task) -> None:
        """Start synchronising ``task``; report completion with ``scheduler.finished(task)``."""


class Scheduler:
    name = "fifo"

    def __init__(
        self,
        settings: Settings,
        clock: Clock,
        transport: Transport,
        on_done: Callable[[Task], None] | None = None,
        monitor: BandwidthMonitor | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.transport = transport
        self.traits: EngineTraits = transport.traits
        self.on_done = on_done or (lambda task: None)
        # The plugins measure their link with ``LinkMonitor`` (start-up latency, shifts); the core's
        # monitor takes each completion as an exact sample.
        self.bandwidth = monitor or BandwidthMonitor(serializations=self.traits.stages)
        self.in_flight_bytes = 0
        self.in_flight_count = 0
        self._dispatching = False
        self._dispatch_again = False
        self.on_wakeup: Callable[[float], None] | None = None
        self._wakeup_asked: float | None = None

    # -- events -------------------------------------------------------------------------------------
    def post(self, task: Task) -> None:
        if task.parent is not None or task.state is not State.POSTED:
            raise ValueError(f"post() takes a whole gradient once, got {task!r}")
        task.state = State.READY
        task.ready_time = self.clock.now()
        self._on_ready(task)
        self._kick()

    def finished(self, piece: Task | Fused) -> None:
        now = self.clock.now()
        if piece.state is not State.STARTED:
            raise ValueError(f"finished() for a slice that was not started: {piece!r}")
        piece.state = State.FINISHED
        piece.finish_time = now
        self.bandwidth.on_finish(piece, now)
        self.in_flight_bytes -= piece.nbytes
        self.in_flight_count -= 1
        self._on_finished(piece)
        if type(piece) is Fused:
            for member in piece.members:
                if member.state is not State.STARTED:
                    raise RuntimeError(f"finished() for a fused slice that was not started: {member!r}")
                member.state = State.FINISHED
                member.finish_time = now
                self._rows_finished(member, now)
        else:
            self._rows_finished(piece, now)
        self._kick()

    def _rows_finished(self, piece: Task, now: float) -> None:
        parent = piece.parent
        root = piece if parent is None else parent.root
        root.rows_done += piece.rows
        if root.rows_done > root.shape[0]:
            raise RuntimeError(f"{root.name}: rows synchronised twice in iteration {root.iteration}")
        if root.rows_done == root.shape[0]:
            root.state = State.FINISHED
            root.finish_time = now
            self.on_done(root)

    def end_of_backward(self, iteration: int) -> None:
        self._on_end_of_backward(iteration)
        self._kick()

    def renumber(self, index_of: dict[int, int]) -> None:
        """From the next post on, the gradient posted as index ``i`` is posted as ``index_of[i]`` (a
        permutation; indices it leaves out keep theirs). Called between iterations, after
        ``end_of_backward``: what the scheduler learned per index is kept under the new numbers."""
        self._on_renumber(index_of)

    def tick(self) -> None:
        """A time asked for with ``on_wakeup`` has come. A timer may keep only its earliest time, so
        whatever the dispatch still needs is asked for again."""
        self._wakeup_asked = None
        self._kick()

    # -- what subclasses change ---------------------------------------------------------------------
    def _on_ready(self, task: Task) -> None:
        self._start(task.slice(0, task.shape[0]))

    def _on_finished(self, piece: Task) -> None:
        pass

    def _on_end_of_backward(self, iteration: int) -> None:
        pass

    def _on_renumber(self, index_of: dict[int, int]) -> None:
        pass

    def _dispatch(self) -> None:
        pass

    # -- shared machinery -----------------------------------------------------------------------------
    def _start(self, piece: Task | Fused) -> None:
        now = self.clock.now()
        piece.state = State.STARTED
        piece.start_time = now
        for member in piece.members if type(piece) is Fused else (piece,):
            if member is not piece:
                if member.state is not State.READY:
                    raise RuntimeError(f"fused a slice that is not ready: {member!r}")
                member.state = State.STARTED
                member.start_time = now
            parent = member.parent
            root = member if parent is None else parent.root
            if root.state is State.READY:
                root.state = State.STARTED
                root.start_time = now
        self.in_flight_bytes += piece.nbytes
        self.in_flight_count += 1
        self.bandwidth.on_send(piece, now)
        self.transport.send(piece)

    def _wake_at(self, t: float) -> None:
        """Ask for ``tick()`` at ``t`` (once between ticks per distinct time; a stale tick only
        dispatches again)."""
        if self.on_wakeup is not None and t != self._wakeup_asked:
            self._wakeup_asked = t
            self.on_wakeup(t)

    def _kick(self) -> None:
        """Run the dispatcher until it settles; re-entrant calls (a synchronous transport) fold in."""
        if self._dispatching:
            self._dispatch_again = True
            return
        self._dispatching = True
        try:
            self._dispatch_again = True
            while self._dispatch_again:
                self._dispatch_again = False
                self._dispatch()
        finally:
            self._dispatching = False


class FIFOScheduler(Scheduler):
    """Each gradient sent whole as soon as it is ready: no partitioning, no limit in flight."""

    name = "fifo"
