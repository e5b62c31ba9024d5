"""Prophet (ICPP'21): predictable communication scheduling (docs/ALGORITHMS.md sections 3 and 3b).

ByteScheduler with the credit partitioning replaced by block assignment: it profiles the stepwise
ready pattern (``ReadyProfiler``), measures the link continuously (``bandwidth``), and behaves exactly
like ByteScheduler whenever either is unknown. ``paper`` mode is section 3 as published; the
``default`` mode keeps the prediction but never idles the link. Its rules depend on the engine
(``self.traits``: stages, whether pulls follow pushes, atoms); each rule, with the measurement that
decided it, is a record in docs/DESIGN.md, cited below by its heading.
"""
from __future__ import annotations

import math
from collections import deque
from heapq import heappop, heappush

from byteps_prophet.core.bytescheduler import ByteScheduler
from byteps_prophet.core.profiler import ReadyProfiler, StepProfile
from byteps_prophet.core.task import Task, atom_grid, atom_rows

MIN_FLOOR_BYTES = 64 * 1024
FLOOR_LATENCIES = 4  # a chunk lasts at least this many per-message latencies: overhead <= 25%
PACE_LIMITS = (0.5, 2.0)
TRAILING_CHUNK_BYTES = 2 * 1024 * 1024  # where pulls follow pushes: DESIGN.md, "2 MiB trailing chunks"
KEEPS_UP_BACKLOG = 0.1  # of the step's bytes: DESIGN.md, "Link keeps up"
KEEPS_UP_ITERATIONS = 5  # the rate that decides it: one that this many of the last
KEEPS_UP_REACHED = 2  # ... KEEPS_UP_ITERATIONS iterations' readings reached


class Prophet(ByteScheduler):
    name = "prophet"

    def __init__(self, settings, clock, transport, on_done=None, monitor=None) -> None:
        super().__init__(settings.replace(credit_tuning=False), clock, transport, on_done, monitor)
        self.mode = settings.prophet_mode
        self.profiler = ReadyProfiler(settings.profile_iterations, settings.boundary_factor, settings.drift_tolerance)
        traits = self.traits
        self._serializations = traits.stages
        # Where pulls follow pushes (DESIGN.md, "End-of-backward flush" and the rules after it): keep holding
        # after the end of backward, bound what is in flight by the credit and the flight window, cap
        # every chunk, and send a step the link keeps up with under the credit.
        self._pulls_follow_pushes = traits.pulls_follow_pushes
        self._chunk_cap = settings.max_chunk_bytes or (TRAILING_CHUNK_BYTES if self._pulls_follow_pushes else math.inf)
        # Cuts end on multiples of this many elements' rows (0: any row), for engines where each
        # distinct slice is a key to set up (fixed atoms): see ``_rows_for``.
        self.cut_elements = traits.atom_elements
        self._plan: StepProfile | None = None
        # Derived from the plan once per profile, not per iteration: gradients by predicted ready
        # offset, those offsets in that order, and each block's gradient count.
        self._derived_from: StepProfile | None = None
        self._order: list[int] = []
        self._order_offsets: list[float] = []
        self._block_sizes: list[int] = []
        self._missing: list[int] = []  # per block: gradients not yet arrived this iteration
        self._span = 0.0
        self._sizes: dict[int, int] = {}  # bytes of each gradient, as last posted
        self._bytes_from: list[int] = [0]  # per position in _order: bytes of it and later arrivals
        self._iteration: int | None = None
        self._first_ready = 0.0
        self._arrived: set[int] = set()
        self._upcoming = 0  # position in _order of the next gradient not yet arrived
        self._pace = 1.0  # observed / predicted progress through this iteration's backward pass
        self._next_block = 0  # first block not completely collected
        self._in_last_block = False
        self._backward_done = False  # end_of_backward seen for the current iteration
        self._releases: deque[int] = deque()  # collected blocks whose budget is still to be granted
        # The link model: when each of its stages frees, when each piece sent finishes (FIFO), and
        # how far reality runs behind that model, re-anchored at every completion. Where pulls follow
        # pushes, a pull is requested behind the push the hold keeps queued after it: one more stage
        # (DESIGN.md, "Request-wait stage").
        self._stage_free = [0.0] * (self._serializations + self._pulls_follow_pushes)
        self._flight_depth = len(self._stage_free) * self._chunk_cap  # DESIGN.md, "Flight window"
        self._finishes: deque[tuple[Task, float]] = deque()
        self._lag = 0.0
        self._drain_chunk: float | None = None
        # The rate read at the start of each of the last iterations, with a profile or without:
        # DESIGN.md, "Link keeps up"
        self._recent_rates: deque[float] = deque(maxlen=KEEPS_UP_ITERATIONS)
        self.planned_iterations = 0  # iterations scheduled by the prediction (not under the credit)

    # -- events --------------------------------------------------------------------------------------
    def _on_ready(self, task: Task) -> None:
        now = self.clock.now()
        if task.iteration != self._iteration:
            self._begin_iteration(task.iteration, now)
        index = task.index
        self._sizes[index] = task.nbytes
        self.profiler.record(task.iteration, index, now)
        arrived = self._arrived
        first = index not in arrived
        arrived.add(index)
        for piece in self._queued_pieces(task):
            self._enqueue(piece)
        if self._plan is not None:
            if first:
                block = self._plan.block_of.get(index)
                if block is not None:
                    self._missing[block] -= 1
            self._follow_arrival(index, now)

    def _on_end_of_backward(self, iteration: int) -> None:
        if iteration != self._iteration:
            return
        self._backward_done = True
        self.profiler.close()
        if self._plan is not None:
            self._collect_blocks(until=len(self._plan.blocks))

    def _begin_iteration(self, iteration: int, now: float) -> None:
        self.profiler.close()
        self._iteration, self._first_ready = iteration, now
        self._arrived = set()
        self._plan = self.profiler.profile if self.bandwidth.known else None
        # DESIGN.md, "Link keeps up"
        decide_keeps_up = self._pulls_follow_pushes and self.mode != "paper"
        if decide_keeps_up:
            rate = self.bandwidth.bytes_per_s
            if rate:
                self._recent_rates.append(rate)
        plan = self._plan
        if plan is not None:
            if plan is not self._derived_from:
                offsets = plan.offsets
                self._order = sorted(offsets, key=lambda i: (offsets[i], -i))
                self._order_offsets = [offsets[i] for i in self._order]
                self._block_sizes = [len(block.indices) for block in plan.blocks]
                self._span = plan.span
                self._derived_from = plan
                # Bytes still to arrive before the end of backward, by position in _order: the
                # arrival at the end itself (gradient 0's) is left out.
                sizes, total = self._sizes, 0
                self._bytes_from = [0] * (len(self._order) + 1)
                for k in range(len(self._order) - 2, -1, -1):
                    total += sizes.get(self._order[k], 0)
                    self._bytes_from[k] = total
            if decide_keeps_up and self._link_keeps_up():
                self._plan = None
            else:
                self.planned_iterations += 1
            self._missing = list(self._block_sizes)
        self._upcoming = 0
        self._pace = 1.0
        self._drain_chunk = None
        self._next_block = 0
        self._in_last_block = False
        self._backward_done = False
        self._releases.clear()

    def _follow_arrival(self, index: int, now: float) -> None:
        plan = self._plan
        predicted = plan.offsets.get(index)
        if predicted is not None and predicted > 0.1 * self._span:
            self._pace = min(max((now - self._first_ready) / predicted, PACE_LIMITS[0]), PACE_LIMITS[1])
        order, arrived, upcoming = self._order, self._arrived, self._upcoming
        while upcoming < len(order) and order[upcoming] in arrived:
            upcoming += 1
        self._upcoming = upcoming
        self._collect_blocks(until=plan.block_for(index))

    def _collect_blocks(self, until: int) -> None:
        """Blocks before ``until`` are complete (a later one has started); so is any fully arrived."""
        blocks, missing = self._plan.blocks, self._missing
        while self._next_block < len(blocks):
            block = blocks[self._next_block]
            if self._next_block >= until and missing[self._next_block] > 0:
                return
            if block.gap_after is None:
                self._in_last_block = True
            else:
                self._releases.append(self._next_block)
            self._next_block += 1
        self._in_last_block = True

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
        while self._releases:
            budget = self._plan.blocks[self._releases.popleft()].gap_after * bandwidth
            while self._queue and self._peek().nbytes <= budget:
                piece = self._pop()
                budget -= piece.nbytes
                self._send(piece)
        if self._in_last_block:
            self._dispatch_under_credit()

    def _dispatch_work_conserving(self) -> None:
        self._releases.clear()  # blocks only pace the paper mode
        queue = self._queue
        if not queue:
            return
        now = self.clock.now()
        # Only events move the lag, the pace and the next predicted arrival, so they are read once
        # per dispatch (again after a synchronous transport's events); the link model and the
        # backlog move with every send.
        lag, stage_free, finishes = self._lag, self._stage_free, self._finishes
        lag0 = self._first_stage_lag(lag)
        first_ready, pace, upcoming = self._first_ready, self._pace, self._upcoming
        next_ready = first_ready + pace * self._order_offsets[upcoming] if upcoming < len(self._order) else None
        end = first_ready + pace * self._span
        to_come = self._bytes_from[upcoming]
        # A piece reaches the link ``latency`` after it is sent (the engine's start-up, which ops
        # already in flight overlap; 0 unless the monitor measures one, as in the simulator).
        latency = self.bandwidth.latency
        hold = self._pulls_follow_pushes or not self._backward_done
        under_credit = self._pulls_follow_pushes
        bandwidth = None  # read on the first send: most calls find the link busy and send nothing
        while queue:
            if under_credit and (self.credit <= 0 or self._window_full()):
                return  # DESIGN.md, "In flight under the credit" and "Flight window"
            start = stage_free[0] + lag0  # when the first stage of the link can take it
            if start < now + latency:
                start = now + latency
            if hold and self.in_flight_count:
                # The next completion or predicted arrival: the next chance to decide. While the link
                # stays busy past the time a piece sent then would reach it, that event gives another
                # chance, so nothing is sent now.
                event = finishes[0][1] + lag if finishes else math.inf
                if next_ready is not None and next_ready > now and next_ready < event:
                    event = next_ready
                if start > (event if event > now else now) + latency:
                    # That event can come late (a peer behind, a lag read before it fell behind): woken
                    # at the last moment a piece sent reaches the link as it frees, it never idles.
                    self._wake_at(start - latency)
                    return
            if bandwidth is None:
                bandwidth, cost = self.bandwidth.rate_and_cost()
                floor = self.settings.min_chunk_bytes or max(MIN_FLOOR_BYTES, FLOOR_LATENCIES * bandwidth * cost)
            # Bytes for the chunk that starts on the link at ``start`` (DESIGN.md, "Counting arrivals to come"); an arrival
            # can reach the link ``latency`` after it happens.
            if start < end + latency:
                if next_ready is not None and start + (self.pending_bytes + to_come) / bandwidth < end + latency:
                    chunk = bandwidth * (next_ready + latency - start - cost)  # done before the next arrival
                else:
                    chunk = bandwidth * (end + latency - start - cost)  # backlogged through the end of backward
            else:
                if self._drain_chunk is None:  # after the last arrival: equal chunks for what is pending
                    stages = self._serializations - 1
                    self._drain_chunk = math.sqrt(self.pending_bytes * bandwidth * cost / stages) if stages else math.inf
                chunk = self._drain_chunk
            if chunk < floor:
                chunk = floor
            if chunk > self._chunk_cap:
                chunk = self._chunk_cap
            # The most urgent pending rows, cut to ``chunk`` (``_cut``, inlined): the rest stays queued.
            piece = heappop(queue)[2]
            if piece.nbytes > 1.25 * chunk:
                rows = self._rows_for(piece, chunk)
                if rows < piece.rows:
                    head = piece.split_head(rows)
                    heappush(queue, (piece.priority, next(self._sequence), piece))
                    piece = head
            self.pending_bytes -= piece.nbytes
            # Advance the link model: each stage serves the piece after the previous stage and after
            # the piece before it, for ``cost + bytes / bandwidth``.
            service, done = cost + piece.nbytes / bandwidth, now + latency
            for j, free in enumerate(stage_free):
                shift = lag0 if j == 0 else lag
                free += shift
                done = (free if free > done else done) + service
                stage_free[j] = done - shift
            finishes.append((piece, done - lag))
            self.credit -= piece.numel
            self._start(piece)
            if self._dispatch_again:  # a synchronous transport delivered events: re-read what they move
                lag, next_ready, end = self._lag, self._predicted_next_ready(), self._predicted_end()
                lag0 = self._first_stage_lag(lag)
                to_come = self._bytes_from[self._upcoming]

    def _on_finished(self, piece: Task) -> None:
        self.credit = min(self.credit + piece.numel, self.credit_limit)  # ByteScheduler's
        finishes = self._finishes
        if finishes and finishes[0][0] is piece:  # the head, unless the transport reorders
            self._lag = self.clock.now() - finishes.popleft()[1]
            return
        for k, (sent, predicted) in enumerate(finishes):
            if sent is piece:  # the head, unless the transport reorders
                self._lag = self.clock.now() - predicted
                del self._finishes[k]
                break

    def _window_full(self) -> bool:
        """Whether what is in flight fills the flight window, the larger of one chunk per stage and
        the link's rate times its start-up latency (DESIGN.md, "Flight window"). The monitor is read only
        past the first: most calls find less in flight."""
        if self.in_flight_bytes < self._flight_depth:
            return False
        return self.in_flight_bytes >= self.bandwidth.bytes_per_s * self.bandwidth.latency

    def _link_keeps_up(self) -> bool:
        """Whether the profiled arrivals, served in arrival order at the rate measured over the last
        iterations, leave at most ``KEEPS_UP_BACKLOG`` of the step's bytes queued at the predicted end
        of backward (the last arrival, gradient 0's, left out: it goes first under any rule)."""
        if len(self._recent_rates) < KEEPS_UP_REACHED or not self._bytes_from[0]:
            return False
        rate, sizes = sorted(self._recent_rates)[-KEEPS_UP_REACHED], self._sizes
        free = 0.0
        for index, offset in zip(self._order[:-1], self._order_offsets):
            free = (free if free > offset else offset) + sizes.get(index, 0) / rate
        return (free - self._span) * rate <= KEEPS_UP_BACKLOG * self._bytes_from[0]

    def _first_stage_lag(self, lag: float) -> float:
        """How far the link's first stage runs behind the model. On a parameter server a piece
        completes only once every worker has pushed it, so a completion late because a peer is behind
        says nothing of this worker's own push: there only an early completion moves the first stage."""
        if self._serializations > 1 and lag > 0:
            return 0.0
        return lag

    def _predicted_end(self) -> float:
        return self._first_ready + self._pace * self._span

    def _predicted_next_ready(self) -> float | None:
        if self._upcoming >= len(self._order):
            return None
        return self._first_ready + self._pace * self._order_offsets[self._upcoming]

    def _queued_pieces(self, task: Task) -> list[Task]:
        """ByteScheduler's partition; with ``cut_elements``, runs of whole atoms of about that size
        instead, so that a queued piece never ends inside an atom (the engine would send the whole
        atom with the first piece, and the link model would count the wrong bytes)."""
        if not self.cut_elements:
            return task.partition(self.settings.partition)
        quantum = atom_rows(task.row_numel, self.cut_elements)
        run = quantum * max(1, round(self.settings.partition / (quantum * task.row_numel)))
        return [task.slice(task.row_start + a, task.row_start + b, part=part)
                for part, (a, b) in enumerate(atom_grid(task.rows, task.row_numel, run * task.row_numel))]

    def _cut(self, piece: Task, nbytes: float) -> Task:
        """The first rows of ``piece`` that fit ``nbytes``; the rest goes back to the queue."""
        if piece.nbytes <= 1.25 * nbytes:  # also when nbytes is infinite
            return piece
        rows = self._rows_for(piece, nbytes)
        if rows >= piece.rows:
            return piece
        head = piece.split_head(rows)  # the queued slice, never sent yet, keeps the rest
        self._enqueue(piece)
        return head

    def _rows_for(self, piece: Task, nbytes: float) -> int:
        """Rows of ``piece`` to cut for about ``nbytes``: at least one; with ``cut_elements`` the cut
        ends on the next multiple of that many elements' rows (counted from row 0 of the gradient), so
        every slice is a run of the same fixed atoms whatever the prediction."""
        rows = max(1, int(nbytes // (piece.row_numel * piece.itemsize)))
        if self.cut_elements:
            quantum = atom_rows(piece.row_numel, self.cut_elements)
            end = -(-(piece.row_start + rows) // quantum) * quantum
            rows = end - piece.row_start
        return rows

    def _send(self, piece: Task) -> None:
        self.credit -= piece.numel  # the credit stays accounted, for the paper mode's last block
        self._start(piece)
