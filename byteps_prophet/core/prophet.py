"""Prophet (ICPP'21): predictable communication scheduling (docs/ALGORITHMS.md sections 3 and 3b).

ByteScheduler with the credit partitioning replaced by block assignment: it profiles the stepwise
ready pattern (``ReadyProfiler``), measures the link continuously (``bandwidth``), and behaves exactly
like ByteScheduler whenever either is unknown. ``paper`` mode is section 3 as published; the
``default`` mode keeps the prediction but never idles the link. Its rules depend on the engine
(``self.traits``: stages, whether pulls follow pushes, atoms); each rule, with the measurement that
decided it, is a record in docs/DESIGN.md, cited below by its heading.

What stands on its own lives beside it: the prediction (``core/prediction.py``), the link model
(``core/link_model.py``), the blocks' progress (``core/blocks.py``), the fused collectives
(``core/fusion.py``), the atom cuts (``Task.atom_runs``, ``Task.rows_for``). ``Prophet`` keeps the
decisions (when to send, how much, under which bounds) in one class: each reads the same iteration
state (the plan, the queue, the link model, what is in flight) and changes it, so split further they
would pass that state back and forth.
"""
from __future__ import annotations

import math
from collections import Counter, deque
from heapq import heappop, heappush

from byteps_prophet.core import fusion
from byteps_prophet.core.blocks import BlockProgress
from byteps_prophet.core.bytescheduler import ByteScheduler
from byteps_prophet.core.fusion import END_HOLD_COSTS, FUSION_LATENCIES
from byteps_prophet.core.link_model import LinkModel
from byteps_prophet.core.prediction import StepPrediction
from byteps_prophet.core.ready_pattern import ReadyProfiler, StepProfile
from byteps_prophet.core.task import Task

MIN_FLOOR_BYTES = 64 * 1024
FLOOR_LATENCIES = 4  # a chunk lasts at least this many per-message latencies: overhead <= 25%
TRAILING_CHUNK_BYTES = 2 * 1024 * 1024  # where pulls follow pushes: DESIGN.md, "2 MiB trailing chunks"
KEEPS_UP_BACKLOG = 0.1  # of the step's bytes: DESIGN.md, "Link keeps up"
KEEPS_UP_ITERATIONS = 5  # the rate that decides it: one that this many of the last
KEEPS_UP_REACHED = 2  # ... KEEPS_UP_ITERATIONS iterations' readings reached


class Prophet(ByteScheduler):
    """Three parts: the prediction (``StepPrediction``: when gradients will be ready), the link model
    (``LinkModel``: when what is sent will be done), and the decisions below (when to send, how much:
    the chunk, and under which bounds)."""

    name = "prophet"

    def __init__(self, settings, clock, transport, on_done=None, monitor=None) -> None:
        super().__init__(settings.replace(credit_tuning=False), clock, transport, on_done, monitor)
        self.mode = settings.prophet_mode
        self.profiler = ReadyProfiler(settings.profile_iterations, settings.boundary_factor, settings.drift_tolerance)
        traits = self.traits
        self._serializations = traits.stages
        # Where pulls follow pushes (DESIGN.md, "End-of-backward flush" and the rules after it): keep
        # holding after the end of backward, bound what is in flight by the credit and the flight
        # window, cap every chunk, and send a step the link keeps up with under the credit.
        self._pulls_follow_pushes = traits.pulls_follow_pushes
        self._chunk_cap = settings.max_chunk_bytes or (TRAILING_CHUNK_BYTES if self._pulls_follow_pushes else math.inf)
        # Cuts end on multiples of this many elements' rows (0: any row), for engines where each
        # distinct slice is a key to set up (fixed atoms): see ``Task.rows_for``.
        self.cut_elements = traits.atom_elements
        self.prediction = StepPrediction()
        self.link = LinkModel(self._serializations + self._pulls_follow_pushes, traits.is_parameter_server)
        self._flight_depth = len(self.link.stage_free) * self._chunk_cap  # DESIGN.md, "Flight window"
        # Where a message costs a collective (all-reduce), the transport carries several pieces as one
        # and the user asks (BYTEPS_PROPHET_FUSE, in training and in the simulator alike): fuse the most
        # urgent pending pieces up to the chunk (DESIGN.md, "Fused collectives").
        self.fuses = (settings.fuse and not traits.is_parameter_server and self.mode != "paper"
                      and bool(getattr(transport, "accepts_fused", False)))
        self._plan: StepProfile | None = None
        self._sizes: dict[int, int] = {}  # bytes of each gradient, as last posted
        self._iteration: int | None = None
        self._backward_done = False  # end_of_backward seen for the current iteration
        self._drain_chunk: float | None = None
        self._drain_started = False  # the first collective after the end of backward has gone (fused)
        self.blocks = BlockProgress()  # which profiled blocks are collected; the paper mode's budgets
        # The rate read at the start of each of the last iterations, with a profile or without:
        # DESIGN.md, "Link keeps up"
        self._recent_rates: deque[float] = deque(maxlen=KEEPS_UP_ITERATIONS)
        self.planned_iterations = 0  # iterations scheduled by the prediction (not under the credit)
        self.credit_iterations: Counter[str] = Counter()  # the others, by why the credit scheduled them

    # -- events --------------------------------------------------------------------------------------
    def _on_ready(self, task: Task) -> None:
        now = self.clock.now()
        if task.iteration != self._iteration:
            self._begin_iteration(task.iteration, now)
        index = task.index
        self._sizes[index] = task.nbytes
        self.profiler.record(task.iteration, index, now)
        arrived = self.prediction.arrived
        first = index not in arrived
        arrived.add(index)
        for piece in self._queued_pieces(task):
            self._enqueue(piece)
        plan = self._plan
        if plan is not None:
            if first:
                block = plan.block_of.get(index)
                if block is not None:
                    self.blocks.arrived(block)
            self.prediction.follow(index, now)
            self.blocks.collect(plan, until=plan.block_for(index))

    def _on_end_of_backward(self, iteration: int) -> None:
        if iteration != self._iteration:
            return
        self._backward_done = True
        self.profiler.close()
        if self._plan is not None:
            self.blocks.collect(self._plan, until=len(self._plan.blocks))

    def _on_renumber(self, index_of: dict[int, int]) -> None:
        self.profiler.renumber(index_of)
        self._sizes = {index_of.get(i, i): nbytes for i, nbytes in self._sizes.items()}

    def _on_finished(self, piece: Task) -> None:
        self.credit = min(self.credit + piece.numel, self.credit_limit)  # ByteScheduler's
        self.link.completed(piece, self.clock.now())

    def _begin_iteration(self, iteration: int, now: float) -> None:
        self.profiler.close()
        self._iteration = iteration
        self.prediction.begin(now)
        self._plan = plan = self.profiler.profile if self.bandwidth.known else None
        if plan is None:
            self.credit_iterations["bandwidth unknown" if self.profiler.profile else "no profile yet"] += 1
        # DESIGN.md, "Link keeps up"
        decide_keeps_up = self._pulls_follow_pushes and self.mode != "paper"
        if decide_keeps_up:
            rate = self.bandwidth.bytes_per_s
            if rate:
                self._recent_rates.append(rate)
        if plan is not None:
            if plan is not self.prediction.derived_from:
                self.prediction.derive(plan, self._sizes)
                self.blocks.derive(plan)
            if decide_keeps_up and self._link_keeps_up():
                self._plan = None
                self.credit_iterations["link keeps up"] += 1
            else:
                self.planned_iterations += 1
        self.blocks.begin()
        self._drain_chunk = None
        self._drain_started = False
        self._backward_done = False

    # -- decisions -----------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        if self._plan is None:
            self._dispatch_under_credit()
        elif self.mode == "paper":
            self._dispatch_paper()
        else:
            self._dispatch_work_conserving()

    def _dispatch_paper(self) -> None:
        bandwidth = self.bandwidth.bytes_per_s
        releases = self.blocks.releases
        while releases:
            budget = self._plan.blocks[releases.popleft()].gap_after * bandwidth
            while self._queue and self._peek().nbytes <= budget:
                piece = self._pop()
                budget -= piece.nbytes
                self._send(piece)
        if self.blocks.in_last:
            self._dispatch_under_credit()

    def _dispatch_work_conserving(self) -> None:
        self.blocks.releases.clear()  # blocks only pace the paper mode
        queue = self._queue
        if not queue:
            return
        now = self.clock.now()
        link, prediction = self.link, self.prediction
        # Only events move the lag, the pace and the next predicted arrival, so they are read once
        # per dispatch (again after a synchronous transport's events); the link model and the
        # backlog move with every send.
        lag0, next_ready, end = link.first_stage_lag(), prediction.next_ready(), prediction.end()
        to_come = prediction.bytes_to_come()
        # A piece reaches the link ``latency`` after it is sent (the engine's start-up, which ops
        # already in flight overlap; 0 unless the monitor measures one).
        latency = self.bandwidth.latency
        hold = self._pulls_follow_pushes or not self._backward_done
        under_credit = self._pulls_follow_pushes
        bandwidth = None  # read on the first send: most calls find the link busy and send nothing
        while queue:
            if under_credit and (self.credit <= 0 or self._window_full()):
                return  # DESIGN.md, "In flight under the credit" and "Flight window"
            start = link.stage_free[0] + lag0  # when the first stage of the link can take it
            if start < now + latency:
                start = now + latency
            if hold and self.in_flight_count:
                # The next completion or predicted arrival: the next chance to decide. While the link
                # stays busy past the time a piece sent then would reach it, that event gives another
                # chance, so nothing is sent now.
                event = link.next_finish()
                if next_ready is not None and next_ready > now and next_ready < event:
                    event = next_ready
                wake = start - latency  # the last moment a piece sent reaches the link as it frees
                if wake > (event if event > now else now):
                    # That event can come late (a peer behind, a lag read before it fell behind): woken
                    # then, the link never idles. (Compared as the wake time itself: a tick at ``wake``
                    # then finds nothing to wait for, where ``start > now + latency`` could still hold
                    # by rounding and ask for the same instant again, forever.)
                    self._wake_at(wake)
                    return
            if bandwidth is None:
                bandwidth, cost = self.bandwidth.rate_and_cost(self.fuses)
                latencies = FUSION_LATENCIES if self.fuses else FLOOR_LATENCIES
                floor = self.settings.min_chunk_bytes or max(MIN_FLOOR_BYTES, latencies * bandwidth * cost)
            drain = start >= end + latency
            if self.fuses and not drain and next_ready is not None:
                # Gradient 0 (the last arrival) is still to come: a collective that would still be on
                # the ring when it can reach the link makes its collective wait behind this one. Wait
                # for it instead, unless it is late by more than a collective's fixed cost.
                deadline = end + latency + END_HOLD_COSTS * cost
                if start + cost > end + latency and now < deadline:
                    self._wake_at(deadline)
                    return
            chunk = self._chunk_bytes(start, next_ready, end, to_come, latency, bandwidth, cost, floor)
            # The most urgent pending rows, cut to ``chunk``: the rest stays queued.
            piece = heappop(queue)[2]
            if self.fuses and drain and not self._drain_started:
                chunk = fusion.first_drain_chunk(prediction, self._sizes, piece, chunk, floor, cost)
            # (fused, after the end of backward: pieces are fused up to the chunk but never cut, since a
            # real engine's collective costs more than the fixed cost its monitor measures: its start-up)
            if piece.nbytes > 1.25 * chunk and not (self.fuses and drain):
                rows = piece.rows_for(chunk, self.cut_elements)
                if rows < piece.rows:
                    head = piece.split_head(rows)
                    heappush(queue, (piece.priority, next(self._sequence), piece))
                    piece = head
            elif self.fuses and queue and piece.nbytes < chunk:
                piece = fusion.fuse_pending(queue, piece, chunk)
            if drain:
                self._drain_started = True
            self.pending_bytes -= piece.nbytes
            link.advance(piece, now + latency, cost + piece.nbytes / bandwidth)
            self.credit -= piece.numel
            self._start(piece)
            if self._dispatch_again:  # a synchronous transport delivered events: re-read what they move
                lag0, next_ready, end = link.first_stage_lag(), prediction.next_ready(), prediction.end()
                to_come = prediction.bytes_to_come()

    def _chunk_bytes(self, start: float, next_ready: float | None, end: float, to_come: int, latency: float,
                     bandwidth: float, cost: float, floor: float) -> float:
        """Bytes for the chunk that starts on the link at ``start`` (DESIGN.md, "Counting arrivals to
        come", "Drain chunk", "Chunk floor", "2 MiB trailing chunks"); an arrival can reach the link
        ``latency`` after it happens."""
        if start < end + latency:
            if next_ready is not None and start + (self.pending_bytes + to_come) / bandwidth < end + latency:
                chunk = bandwidth * (next_ready + latency - start - cost)  # done before the next arrival
            else:
                chunk = bandwidth * (end + latency - start - cost)  # backlogged through the end of backward
        else:
            if self._drain_chunk is None:  # after the last arrival: equal chunks for what is pending
                if self.fuses:
                    self._drain_chunk = fusion.drain_chunk(self.prediction, self.pending_bytes, bandwidth, cost)
                else:
                    stages = self._serializations - 1
                    self._drain_chunk = math.sqrt(self.pending_bytes * bandwidth * cost / stages) if stages else math.inf
            chunk = self._drain_chunk
        if chunk < floor and not (self.fuses and not self._drain_started and start >= end + latency):
            chunk = floor  # (the first fused collective after backward: fusion.first_drain_chunk)
        if chunk > self._chunk_cap:
            chunk = self._chunk_cap
        return chunk

    def _window_full(self) -> bool:
        """Whether what is in flight fills the flight window: one chunk per stage plus what the link
        carries in one start-up latency (DESIGN.md, "Flight window"). The monitor is read only past
        the chunks: most calls find less in flight."""
        if self.in_flight_bytes < self._flight_depth:
            return False
        return self.in_flight_bytes >= self._flight_depth + self.bandwidth.bytes_per_s * self.bandwidth.latency

    def _link_keeps_up(self) -> bool:
        """Whether the profiled arrivals, served in arrival order at the rate measured over the last
        iterations, leave at most ``KEEPS_UP_BACKLOG`` of the step's bytes queued at the predicted end
        of backward (the last arrival, gradient 0's, left out: it goes first under any rule)."""
        step_bytes = self.prediction.bytes_from[0]
        if len(self._recent_rates) < KEEPS_UP_REACHED or not step_bytes:
            return False
        rate = sorted(self._recent_rates)[-KEEPS_UP_REACHED]
        return self.prediction.backlog_at_end(rate, self._sizes) <= KEEPS_UP_BACKLOG * step_bytes

    def _queued_pieces(self, task: Task) -> list[Task]:
        """ByteScheduler's partition; with ``cut_elements``, runs of whole atoms of about that size."""
        if not self.cut_elements:
            return task.partition(self.settings.partition)
        return task.atom_runs(self.settings.partition, self.cut_elements)

    def _send(self, piece: Task) -> None:
        self.credit -= piece.numel  # the credit stays accounted, for the paper mode's last block
        self._start(piece)
