"""Prophet's default (work-conserving) mode with a fake clock and an in-memory FIFO link."""
import heapq
import itertools

import pytest

from byteps_prophet.core import ByteScheduler, EngineTraits, ManualClock, Prophet, Settings, Task
from byteps_prophet.core.bandwidth import BandwidthMonitor
from byteps_prophet.core.prophet import TRAILING_CHUNK_BYTES
from byteps_prophet.sim.simulation import Layer, SimulatedCluster, Simulation

COST = 50e-6
BANDWIDTH = 1e9  # bytes/s


class Loop:
    """Timed callbacks on a ManualClock."""

    def __init__(self) -> None:
        self.clock = ManualClock()
        self._heap, self._seq = [], itertools.count()

    def at(self, t, fn, *args):
        heapq.heappush(self._heap, (t, next(self._seq), fn, args))

    def run_until(self, t_end=float("inf")):
        while self._heap and self._heap[0][0] <= t_end:
            t, _, fn, args = heapq.heappop(self._heap)
            self.clock.set(t)
            fn(*args)


class HeldProphet(Prophet):
    """Prophet that holds every profiled step, as one the link does not keep up with: isolates the
    hold's rules from the decision of docs/DESIGN.md, "Link keeps up"."""

    def _link_keeps_up(self) -> bool:
        return False


class UnwindowedProphet(HeldProphet):
    """``HeldProphet`` without the flight window, to show what the window changes."""

    def _window_full(self) -> bool:
        return False


class FifoLink:
    """In-memory transport: ``stages`` FIFO stages, each cost + bytes/bandwidth per piece; sends whole
    atoms of ``atom_elements`` where given (the scheduler cuts on them)."""

    def __init__(self, loop: Loop, stages: int = 1, atom_elements: int = 0) -> None:
        self.loop = loop
        self.traits = EngineTraits(stages=stages, atom_elements=atom_elements)
        self.free = [0.0] * stages
        self.scheduler = None
        self.sent: list[tuple[float, Task]] = []

    def send(self, task):
        done = self.loop.clock.now()
        self.sent.append((done, task))
        for j, free in enumerate(self.free):
            done = self.free[j] = max(free, done) + COST + task.nbytes / BANDWIDTH
        self.loop.at(done, self.scheduler.finished, task)


def make(loop, scheduler_cls=Prophet, stages=1, atom_elements=0, **settings):
    link = FifoLink(loop, stages, atom_elements)
    scheduler = scheduler_cls(Settings(scheduler=scheduler_cls.name, **settings), loop.clock, link)
    link.scheduler = scheduler
    return scheduler, link


def test_falls_back_to_credit_without_a_profile():
    """With no profile yet, the first iteration is sent exactly as ByteScheduler sends it."""
    keys = []
    for cls in (ByteScheduler, Prophet):
        loop = Loop()
        scheduler, link = make(loop, cls, credit=3_000_000)
        for i in (3, 2, 1, 0):
            loop.at(i * 1e-3 * (4 - i), scheduler.post, Task(f"g{i}", i, (2000, 1000)))
        loop.run_until()
        keys.append([(round(t, 9), task.key) for t, task in link.sent])
    assert keys[0] == keys[1]
    assert scheduler._plan is None


def run_iterations(scheduler, loop, arrivals, iterations, period, signal_end=True, ticks=True, first=0):
    """Post gradients at fixed offsets (index, offset s, shape) every ``period`` seconds, iterations
    ``first`` to ``first + iterations - 1``; with ``signal_end`` call ``end_of_backward`` at the last
    one, as the plugins do; with ``ticks`` call ``tick`` when the scheduler asks, as the plugins' timer
    and the simulator do."""
    if ticks:
        scheduler.on_wakeup = lambda t: loop.at(t, scheduler.tick)
    for it in range(first, first + iterations):
        t0 = it * period
        for index, offset, shape in arrivals:
            loop.at(t0 + offset, scheduler.post, Task(f"g{index}", index, shape, iteration=it))
        last = max(offset for _, offset, _ in arrivals)
        if signal_end:
            loop.at(t0 + last, scheduler.end_of_backward, it)
    loop.run_until()


def test_cuts_a_chunk_to_finish_before_the_next_predicted_arrival():
    loop = Loop()
    scheduler, link = make(loop, partition=10**9)  # no pre-partitioning: Prophet alone cuts
    # A 20 MB gradient, then a small urgent one 10 ms later, then the last 50 ms in: the 20 ms of
    # backlog clears before the end of backward, so the small one's arrival is worth waiting for.
    arrivals = [(2, 0.0, (5000, 1000)), (1, 0.010, (10, 1000)), (0, 0.050, (10, 1000))]
    run_iterations(scheduler, loop, arrivals, iterations=6, period=0.2)
    assert scheduler._plan is not None
    last = [(t, task) for t, task in link.sent if task.iteration == 5]
    t0, first = last[0]
    assert first.index == 2 and first.rows < 5000  # cut, not sent whole
    assert first.nbytes == pytest.approx(BANDWIDTH * (0.010 - COST), rel=0.05)
    ready = t0 + 0.010
    start_1 = next(t for t, task in last if task.index == 1)
    assert start_1 - ready < 1e-3  # the urgent one waited less than a millisecond
    # Every row of every gradient went exactly once.
    for index, _, shape in arrivals:
        rows = sorted((task.row_start, task.row_end) for _, task in last if task.index == index)
        assert rows[0][0] == 0 and rows[-1][1] == shape[0]
        assert all(a[1] == b[0] for a, b in zip(rows, rows[1:]))


def test_cuts_end_on_the_atom_grid_when_asked():
    """With ``cut_elements`` (the BytePS backend's fixed atoms) every cut ends on a multiple of that many
    elements' rows, counted from row 0, and every row still goes exactly once."""
    loop = Loop()
    scheduler, link = make(loop, partition=10**9, atom_elements=300 * 1000)  # 300 rows of 1000 elements
    arrivals = [(2, 0.0, (5000, 1000)), (1, 0.010, (10, 1000)), (0, 0.050, (10, 1000))]
    run_iterations(scheduler, loop, arrivals, iterations=6, period=0.2)
    last = [task for _, task in link.sent if task.iteration == 5]
    big = sorted((task.row_start, task.row_end) for task in last if task.index == 2)
    assert len(big) > 1  # Prophet did cut it
    assert all(end % 300 == 0 or end == 5000 for _, end in big), big
    assert big[0][0] == 0 and big[-1][1] == 5000 and all(a[1] == b[0] for a, b in zip(big, big[1:]))


def test_queued_pieces_are_runs_of_whole_atoms():
    """With ``cut_elements`` the partition pieces are queued as runs of whole atoms too: one ending
    inside an atom would make the engine send that whole atom with it, and the link model count the
    wrong bytes (a 2048-row gradient partitioned at 1024 rows with 488-row atoms sent a 48-row
    "piece" that was really 488 rows)."""
    loop = Loop()
    scheduler, link = make(loop, partition=4 * 2048 * 488, atom_elements=488 * 2048)
    task = Task("g0", 0, (2048, 2048))
    pieces = scheduler._queued_pieces(task)
    assert [(p.row_start, p.row_end) for p in pieces] == [(0, 1952), (1952, 2048)]
    plain, _ = make(Loop(), partition=4 * 2048 * 488)  # without atoms: ByteScheduler's partition, evenly spread
    assert [(p.row_start, p.row_end) for p in plain._queued_pieces(task)] == [(0, 1024), (1024, 2048)]


def test_does_not_cut_for_an_arrival_when_later_arrivals_keep_the_link_busy_to_the_end():
    """Cutting before an arrival only pays when the link would otherwise go idle before the end of
    backward; when the bytes still to arrive keep it busy to the end, a cut only adds a message."""
    loop = Loop()
    scheduler, link = make(loop, partition=10**9)
    # 20 MB now, 40 MB at 10 ms, the last (small) at 50 ms: 60 ms of bytes before a 50 ms end.
    arrivals = [(2, 0.0, (5000, 1000)), (1, 0.010, (10000, 1000)), (0, 0.050, (10, 1000))]
    run_iterations(scheduler, loop, arrivals, iterations=6, period=0.3)
    assert scheduler._plan is not None
    last = [task for _, task in link.sent if task.iteration == 5]
    assert last[0].index == 2 and last[0].rows == 5000  # sent whole: no message spent on a cut


def stepwise_layers():
    shapes = [(64, 27), (64,), (128, 576), (128,), (256, 1152), (256,), (512, 2304), (4096, 4096),
              (4096,), (1000, 4096), (1000,)]
    return [Layer(f"l{i}", s, fwd_s=2e-3, bwd_s=(4e-3 if i % 3 == 0 else 1e-4)) for i, s in enumerate(shapes)]


@pytest.mark.parametrize("arch, bandwidth", [("ps", 1e9 / 8), ("ps", 25e9 / 8), ("allreduce", 3e9 / 8),
                                             ("allreduce", 100e9 / 8)])
def test_never_idles_the_link_while_bytes_are_pending(arch, bandwidth):
    sim = Simulation(stepwise_layers(), SimulatedCluster(workers=4, arch=arch, bandwidth=bandwidth),
                     Settings(scheduler="prophet"), iterations=12, warmup=4)
    scheduler, network, loop = sim.scheduler, sim.network, sim.loop
    first_stage = (lambda: network._up.free) if arch == "ps" else (lambda: network._free)
    idle_with_pending = []
    loop.at(0.0, sim._forward, 0)
    heap = loop._heap
    while heap:
        loop.time, _, callback, arg = heapq.heappop(heap)
        callback(arg)
        if heap and heap[0][0] == loop.time:
            continue  # judge the state once every event at this instant has run
        if scheduler._queue and first_stage() <= loop.time:
            idle_with_pending.append(loop.time)
    assert scheduler._plan is not None  # the default mode was in charge after profiling
    assert not idle_with_pending
    assert scheduler.pending_bytes == 0 and not scheduler._queue


class LatencyLink:
    """One FIFO stage whose ops reach it ``latency`` after they are sent (an engine's start-up, which
    ops already in flight overlap, as gloo's and BytePS's do)."""

    traits = EngineTraits(stages=1)

    def __init__(self, loop: Loop, latency: float) -> None:
        self.loop, self.latency, self.free = loop, latency, 0.0
        self.sent: list[tuple[float, Task]] = []
        self.in_flight = 0
        self.max_in_flight: dict[int, int] = {}  # per iteration: the most ops in flight at once
        self.scheduler = None

    def send(self, task):
        now = self.loop.clock.now()
        self.sent.append((now, task))
        self.in_flight += 1
        self.max_in_flight[task.iteration] = max(self.max_in_flight.get(task.iteration, 0), self.in_flight)
        self.free = max(self.free, now + self.latency) + COST + task.nbytes / BANDWIDTH
        self.loop.at(self.free, self._finished, task)

    def _finished(self, task):
        self.in_flight -= 1
        self.scheduler.finished(task)


def run_on_latency_link(told, latency=0.005, signal_end=False, stages=1):
    """A 20 MB gradient at 0, five 64 KB ones at the end of backward (10.0-10.4 ms), on a link where
    every op pays ``latency``; the monitor reports ``told``. Returns (last iteration's sends, its
    gradients' finish times, the link), times relative to the iteration's start. Without
    ``signal_end`` the scheduler is not told that backward ended: only the hold decides."""
    loop = Loop()
    link = LatencyLink(loop, latency)
    link.traits = EngineTraits(stages=stages)
    scheduler = Prophet(Settings(scheduler="prophet", partition=10**9), loop.clock, link)
    link.scheduler = scheduler
    scheduler.bandwidth.latency = told
    done = {}
    scheduler.on_done = lambda task: done.__setitem__((task.iteration, task.index), loop.clock.now())
    arrivals = [(5, 0.0, (5000, 1000))] + [(i, 0.010 + 1e-4 * (4 - i), (16, 1000)) for i in range(5)]
    period = 0.1
    run_iterations(scheduler, loop, arrivals, iterations=6, period=period, signal_end=signal_end)
    assert scheduler._plan is not None  # the default mode decided the last iteration
    t0 = 5 * period
    sends = [(t - t0, task) for t, task in link.sent if task.iteration == 5]
    finishes = {index: t - t0 for (it, index), t in done.items() if it == 5}
    return sends, finishes, link


def test_latency_reported_small_pieces_go_in_flight_together():
    """With the start-up latency reported, a small piece is sent while the op on the link frees within
    that latency of the next event: all small gradients after the end of backward are in flight
    together, instead of one per completion each paying the latency on an idle link."""
    sends, finishes, link = run_on_latency_link(told=0.005)
    end = 0.0104  # gradient 0's arrival, the end of backward
    small = [t for t, task in sends if task.index < 5]
    assert len(small) == 5 and all(t <= end + 1e-9 for t in small)  # none waited for a completion
    assert link.max_in_flight[5] >= 6  # the small ones and the chunk of the large one on the link
    _, unaware, _ = run_on_latency_link(told=0.0)
    assert max(finishes.values()) < max(unaware.values()) - 0.008  # the iteration ends >= 8 ms sooner
    assert finishes[0] <= unaware[0]


@pytest.mark.parametrize("stages", [1, 2])
def test_end_of_backward_sends_everything_pending(stages):
    """After end_of_backward nothing more urgent can arrive and the link (an all-reduce, or a
    parameter server's push then pull) serves pieces in the order sent: no hold, even with the
    latency unknown (0), everything pending goes in flight at once, most urgent first."""
    sends, finishes, link = run_on_latency_link(told=0.0, signal_end=True, stages=stages)
    _, held, _ = run_on_latency_link(told=0.0, signal_end=False, stages=stages)
    end = 0.0104
    after = [(t, task) for t, task in sends if t >= end - 1e-9]
    assert len(after) >= 5 and all(t == pytest.approx(end) for t, _ in after)
    assert [task.index for _, task in after] == sorted(task.index for _, task in after)  # most urgent first
    assert link.max_in_flight[5] >= 6
    # one stage: the hold left the link idle through the start-up latency; two: it cost nothing here
    gain = 0.008 if stages == 1 else 0.0
    assert max(finishes.values()) <= max(held.values()) - gain + 1e-12 and finishes[0] <= held[0]


def test_latency_zero_keeps_one_piece_queued_behind_the_link():
    """Latency 0 (the core monitor's, the simulator's) on a link whose ops pay 5 ms: after the end of
    backward a small gradient is sent when the model's link frees (a completion or, when that comes
    later than the model says, the tick asked for then), so the small ones go one at a time, never
    all at once: at most one queued behind the op on the link, and one more paying its latency."""
    sends, _, link = run_on_latency_link(told=0.0)
    small = sorted(t for t, task in sends if task.index < 5)
    assert len(small) == 5 and link.max_in_flight[5] == 3
    assert all(b - a > 0.0015 for a, b in zip(small, small[1:]))  # each waited for the link to free


class PullRequestLink:
    """A parameter server as BytePS drives it: a piece is pushed over the uplink (FIFO), and only when
    its push is done is its pull requested, over the same uplink, so the request is served after every
    byte pushed before then; the pull then comes back over the downlink (FIFO)."""

    traits = EngineTraits(stages=2, pulls_follow_pushes=True)
    rate = BANDWIDTH  # bytes/s each way

    def __init__(self, loop: Loop) -> None:
        self.loop, self.up_free, self.down_free = loop, 0.0, 0.0
        self.sent: list[tuple[float, Task]] = []
        self.scheduler = None

    def send(self, task):
        now = self.loop.clock.now()
        self.sent.append((now, task))
        self.up_free = max(self.up_free, now) + COST + task.nbytes / self.rate
        self.loop.at(self.up_free, self._request_pull, task)

    def _request_pull(self, task):
        requested = max(self.up_free, self.loop.clock.now())  # behind what was pushed before now
        self.down_free = max(self.down_free, requested) + COST + task.nbytes / self.rate
        self.loop.at(self.down_free, self._finished, task)

    def _finished(self, task):
        self.scheduler.finished(task)


@pytest.mark.parametrize("told", [True, False])
def test_pull_requests_behind_pushes_keep_the_hold_after_backward(told, monkeypatch):
    """Where a pull is requested behind the pushes sent before it (``pulls_follow_pushes``), sending
    everything at the end of backward would make every pull, gradient 0's too, wait for all of those
    pushes. Told so, Prophet keeps holding after the end of backward: gradient 0 (arriving last) is
    synchronised far sooner and the iteration ends no later."""
    if not told:
        monkeypatch.setattr(PullRequestLink, "traits", EngineTraits(stages=2))
    loop = Loop()
    link = PullRequestLink(loop)
    scheduler = Prophet(Settings(scheduler="prophet", partition=10**9), loop.clock, link)
    link.scheduler = scheduler
    done = {}
    scheduler.on_done = lambda task: done.__setitem__((task.iteration, task.index), loop.clock.now())
    # a 40 MB gradient just before the end of backward, then five small ones (gradient 0 last)
    arrivals = [(5, 0.008, (10000, 1000))] + [(i, 0.010 + 1e-4 * (4 - i), (16, 1000)) for i in range(5)]
    period = 0.2
    run_iterations(scheduler, loop, arrivals, iterations=6, period=period)
    assert scheduler._plan is not None
    finishes = {index: t - 5 * period for (it, index), t in done.items() if it == 5}
    assert len(finishes) == 6
    if told:  # gradient 0 waits for a chunk or two of the 40 MB, not for all of it
        assert finishes[0] < 0.010 + 0.015
    else:
        assert finishes[0] > 0.008 + 0.040  # behind the whole 40 MB push
    assert max(finishes.values()) < 0.008 + 2 * (0.040 + 0.005)


def test_pull_requests_behind_pushes_keep_the_uplink_busy():
    """A pull requested behind the push the hold keeps queued after it finishes one push later than a
    two-stage model predicts; modelled as a third stage, the hold keeps enough queued that the uplink
    never idles while bytes are pending. vgg-like burst: two 16 MB layers first, the small ones last,
    pieces of at most 1 MB."""
    loop = Loop()
    link = PullRequestLink(loop)
    scheduler = Prophet(Settings(scheduler="prophet", max_chunk_bytes=1_000_000), loop.clock, link)
    link.scheduler = scheduler
    done = {}
    scheduler.on_done = lambda task: done.__setitem__((task.iteration, task.index), loop.clock.now())
    arrivals = [(12, 0.0, (4000, 1000)), (10, 0.001, (4000, 1000)), (8, 0.0015, (1200, 1000)),
                (6, 0.0018, (600, 1000)), (4, 0.0019, (300, 1000)), (2, 0.0020, (80, 1000)), (0, 0.0021, (2, 1000))]
    period = 0.2
    run_iterations(scheduler, loop, arrivals, iterations=6, period=period)
    finishes = {index: t - 5 * period for (it, index), t in done.items() if it == 5}
    pushed = sum(rows * cols * 4 for _, _, (rows, cols) in arrivals) / BANDWIDTH  # 40.7 ms of pushes
    # every byte pushed back to back, then the last megabyte pulled: 44-45 ms (a two-stage model kept
    # too little queued and took 56 ms; ByteScheduler with a 1 MB credit of 250 k-element pieces, 47 ms).
    # 46.3 ms since a late completion no longer delays the first stage (45.5 before; the price of not
    # holding pushes for a slow peer, test_a_late_peer_does_not_hold_this_workers_pushes)
    assert max(finishes.values()) < pushed + 0.006
    assert finishes[0] < 0.0021 + 0.004  # gradient 0 still waits for about one piece, not the burst


class LatePeerLink(PullRequestLink):
    """``PullRequestLink`` with a second worker whose copy of every gradient is ready ``delay`` after
    this one's: a key is pulled only once both workers have pushed it (over their own uplinks)."""

    def __init__(self, loop: Loop, delay: float) -> None:
        super().__init__(loop)
        self.delay, self.peer_up_free = delay, 0.0
        self.ready: dict[tuple[int, int], float] = {}

    def send(self, task):
        now = self.loop.clock.now()
        self.sent.append((now, task))
        service = COST + task.nbytes / self.rate
        self.up_free = max(self.up_free, now) + service
        peer_ready = self.ready[(task.iteration, task.index)] + self.delay
        self.peer_up_free = max(self.peer_up_free, peer_ready, now) + service
        self.loop.at(max(self.up_free, self.peer_up_free), self._request_pull, task)


class ToldLink(BandwidthMonitor):
    """The rate it is told (the link's true rate unless set) and the link's cost, whatever the completions say
    (isolates the link model's lag)."""

    known = True
    bytes_per_s = BANDWIDTH

    def rate_and_cost(self, collective=False):
        return self.bytes_per_s, COST


def run_with_a_late_peer(ticks=True, latency=None, **settings):
    """A peer 50 ms behind on a ``LatePeerLink``, compute-bound: a 4 MB gradient every 10 ms, each
    4 ms on the link. Returns the last iteration's waits (each piece's send after its gradient was
    ready) and its tail (the last completion after the peer's last push), in seconds. Without a
    ``latency`` the flight window is off, as the credit is: the link model's lag alone decides."""
    loop = Loop()
    link = LatePeerLink(loop, delay=0.050)
    # a credit that never binds (it would hold pieces here as it holds ByteScheduler's,
    # test_where_pulls_follow_pushes_the_credit_bounds_...)
    cls = UnwindowedProphet if latency is None else HeldProphet
    scheduler = cls(Settings(scheduler="prophet", credit=10**9, **settings), loop.clock, link,
                    monitor=ToldLink(serializations=2))
    scheduler.bandwidth.latency = latency or 0.0
    link.scheduler = scheduler
    done = {}
    scheduler.on_done = lambda task: done.__setitem__((task.iteration, task.index), loop.clock.now())
    original_post = scheduler.post

    def post(task):
        link.ready[(task.iteration, task.index)] = loop.clock.now()
        original_post(task)

    scheduler.post = post
    arrivals = [(i, 0.010 * (9 - i), (1000, 1000)) for i in range(10)]
    period = 0.3
    run_iterations(scheduler, loop, arrivals, iterations=6, period=period, ticks=ticks)
    assert scheduler._plan is not None
    t0 = 5 * period
    waits = [t - link.ready[(5, task.index)] for t, task in link.sent if task.iteration == 5]
    tail = max(t for (it, _), t in done.items() if it == 5) - (t0 + 0.090 + 0.050)
    return waits, tail


def test_a_late_peer_does_not_hold_this_workers_pushes():
    """On a parameter server a piece completes only when every worker has pushed it, so with a peer
    50 ms behind every completion comes late and the link model's lag grows. That says nothing of this
    worker's own uplink: Prophet still pushes each gradient as it arrives, and the iteration ends one
    piece's push and pull after the peer's last push (with the lag on the first stage, pieces waited
    until the peer caught up: docs/DESIGN.md, "Late peer (first-stage lag)")."""
    waits, tail = run_with_a_late_peer()
    # pushed on arrival, or (a gradient's second 2 MiB piece) as the first one's push ends
    assert max(waits) < COST + TRAILING_CHUNK_BYTES / BANDWIDTH + 1e-6
    # the flight window too: every op waits for the peer, which the plugins' LinkMonitor reads as
    # a 50 ms start-up latency, and the window then covers what the link carries in it
    windowed, _ = run_with_a_late_peer(latency=0.050)
    assert max(windowed) < COST + TRAILING_CHUNK_BYTES / BANDWIDTH + 1e-6
    assert tail < 2 * (COST + 4e6 / BANDWIDTH) - 0.002  # the last piece's push and pull, about 5 ms


def test_a_late_completion_does_not_idle_the_uplink():
    """Each gradient cut in two (2 MB pieces) with the peer 50 ms behind: after the first piece the
    hold waits for the next completion, which comes 50 ms late. With the tick it asks for when the
    uplink frees, the second piece is pushed then; without a timer it waited 40-60 ms for that
    completion on an idle uplink. (Here the peer's lateness hides the wait; without the timer the held
    pieces went in a burst after the end of backward: docs/DESIGN.md, "Wakeups".)"""
    cap = dict(max_chunk_bytes=2_000_000)
    waits, tail = run_with_a_late_peer(**cap)
    held, held_tail = run_with_a_late_peer(ticks=False, **cap)
    assert max(waits) < COST + 2e6 / BANDWIDTH + 1e-6  # on arrival, or as the first piece's push ends
    assert max(held) > 0.040 and tail <= held_tail


class CountingPullRequestLink(PullRequestLink):
    """``PullRequestLink`` that records, per iteration, the most elements in flight at once."""

    def __init__(self, loop: Loop) -> None:
        super().__init__(loop)
        self.in_flight = 0
        self.max_in_flight: dict[int, int] = {}

    def send(self, task):
        self.in_flight += task.numel
        self.max_in_flight[task.iteration] = max(self.max_in_flight.get(task.iteration, 0), self.in_flight)
        super().send(task)

    def _finished(self, task):
        self.in_flight -= task.numel
        self.scheduler.finished(task)


def run_burst(link, arrivals, latency=0.0, cls=Prophet, **settings):
    """Six iterations of ``arrivals`` on ``link`` (a ``PullRequestLink``), Prophet (or ``cls``) told the
    link's true rate and cost and a start-up latency of ``latency``. Returns the last iteration's
    finish times."""
    loop = link.loop
    scheduler = cls(Settings(scheduler="prophet", **settings), loop.clock, link, monitor=ToldLink(serializations=2))
    scheduler.bandwidth.latency = latency
    link.scheduler = scheduler
    done = {}
    scheduler.on_done = lambda task: done.__setitem__((task.iteration, task.index), loop.clock.now())
    run_iterations(scheduler, loop, arrivals, iterations=6, period=0.2)
    assert scheduler._plan is not None
    finishes = {index: t - 5 * 0.2 for (it, index), t in done.items() if it == 5}
    assert len(finishes) == len(arrivals)
    return finishes


def run_burst_with_a_large_latency(credit):
    """vgg-like burst on a ``CountingPullRequestLink`` whose monitor reports BytePS's 150 ms start-up
    latency: two 16 MB layers, then smaller ones, gradient 0 last at 10 ms. Returns the last
    iteration's finish times and the link."""
    link = CountingPullRequestLink(Loop())
    arrivals = [(4, 0.0, (4000, 1000)), (3, 0.002, (4000, 1000)), (2, 0.006, (1200, 1000)),
                (1, 0.008, (300, 1000)), (0, 0.010, (2, 1000))]
    return run_burst(link, arrivals, latency=0.150, credit=credit, partition=250_000), link


def test_where_pulls_follow_pushes_the_credit_bounds_what_is_in_flight():
    """BytePS's completions read as a long start-up latency (docs/DESIGN.md, "In flight under the
    credit"), which lets the hold send everything pending once backward ends; every
    pull is then requested behind all of those pushes. There ByteScheduler's credit bounds what
    Prophet has in flight too: at most the credit and one piece, and the iteration ends sooner."""
    credit = 2_000_000  # elements: 8 MB
    finishes, link = run_burst_with_a_large_latency(credit)
    flooded, unbounded = run_burst_with_a_large_latency(10**9)  # a credit that never binds
    piece = max(task.numel for _, task in link.sent)
    assert link.max_in_flight[5] <= credit + piece
    assert unbounded.max_in_flight[5] > 3 * credit  # unbounded: the whole burst in flight
    assert max(finishes.values()) < max(flooded.values()) - 0.015  # 47 ms against 71
    assert finishes[0] <= flooded[0]


UNCAPPED = dict(max_chunk_bytes=10**12)  # a chunk cap that never binds, to show what the cap changes


def run_backlogged_burst(**settings):
    """vgg-like burst on a ``PullRequestLink``, backlogged past the end of backward (37 MB, 37 ms of
    pushes, arriving over 10 ms), gradients queued whole. Returns the last iteration's finish times
    and the link."""
    link = PullRequestLink(Loop())
    arrivals = [(3, 0.0, (4000, 1000)), (2, 0.002, (4000, 1000)), (1, 0.006, (1200, 1000)),
                (0, 0.010, (2, 1000))]
    return run_burst(link, arrivals, credit=10**9, partition=10**9, **settings), link


def run_spaced_burst(**settings):
    """Two 16 MB layers 20 ms apart on a ``PullRequestLink``, gradient 0 at 40 ms, held although the
    link keeps up: each layer is cut to end before the next arrival (whole, without a bound). Returns
    the last iteration's finish times and the link."""
    link = PullRequestLink(Loop())
    arrivals = [(2, 0.0, (4000, 1000)), (1, 0.020, (4000, 1000)), (0, 0.040, (2, 1000))]
    return run_burst(link, arrivals, cls=HeldProphet, credit=10**9, partition=10**9, **settings), link


def test_where_pulls_follow_pushes_a_chunk_before_an_arrival_is_sized_for_its_pulls():
    """The same bound where the link keeps up with backward: a 16 MB layer sent whole is pulled only
    after its 16 ms of pushes, and those pulls then delay the next layer's and gradient 0's."""
    finishes, link = run_spaced_burst()
    before, whole_link = run_spaced_burst(**UNCAPPED)
    assert max(task.nbytes for _, task in link.sent if task.iteration == 5) < 1.25 * TRAILING_CHUNK_BYTES
    assert max(task.nbytes for _, task in whole_link.sent if task.iteration == 5) == 16e6
    assert finishes[2] < before[2] - 0.005  # the first layer pulled as it is pushed: 25 ms against 32
    assert finishes[0] < before[0] - 0.008  # gradient 0: 41 ms against 52


def test_where_pulls_follow_pushes_a_backlog_chunk_is_sized_for_its_pulls():
    """Where a pull is requested only once its push is done, a chunk's pulls start after its last
    byte is pushed, before the last arrival as after it. Cut to end at the predicted end of backward
    while the link is backlogged, chunks were 10 MB and push and pull took turns; at most 2 MiB, they
    overlap, and the iteration and gradient 0 end sooner."""
    finishes, link = run_backlogged_burst()
    before, long_link = run_backlogged_burst(**UNCAPPED)
    largest = max(task.nbytes for _, task in link.sent if task.iteration == 5)
    largest_before = max(task.nbytes for _, task in long_link.sent if task.iteration == 5)
    assert largest < 1.25 * TRAILING_CHUNK_BYTES and largest_before > 8e6  # 2.1 MB against 9.9 MB
    assert max(finishes.values()) < max(before.values()) - 0.010  # 45 ms (37 of pushes) against 59
    assert finishes[0] < before[0] - 0.010  # gradient 0: 17 ms against 31


class SharedServerLink(CountingPullRequestLink):
    """A ``CountingPullRequestLink`` at half the rate the monitor reports: one server's link shared
    by two workers' pushes, each worker's completions paced by both."""

    rate = BANDWIDTH / 2


def run_burst_on_a_shared_server(cls=Prophet):
    """transformer-like burst on a ``SharedServerLink``, backlogged past the end of backward: two
    16 MB layers, a 4 MB one, and gradient 0, an 8 MB embedding, last at 10 ms. Default credit
    (16 MB) and partition. Returns the last iteration's finish times and the link."""
    link = SharedServerLink(Loop())
    arrivals = [(3, 0.0, (4000, 1000)), (2, 0.004, (4000, 1000)), (1, 0.008, (1000, 1000)),
                (0, 0.010, (2000, 1000))]
    return run_burst(link, arrivals, cls=cls), link


def test_where_pulls_follow_pushes_the_flight_window_keeps_gradient_0_near_the_link():
    """The hold trusts the link model's first stage, which late completions do not move, so where the
    link is slower than measured it sends as far ahead as the credit allows, and gradient 0 waits
    behind all of it (docs/DESIGN.md, "Flight window"). The flight window keeps
    one chunk per stage in flight: gradient 0 and the iteration are done sooner."""
    finishes, link = run_burst_on_a_shared_server()
    before, credit_link = run_burst_on_a_shared_server(UnwindowedProphet)
    piece = max(task.numel for _, task in link.sent)
    window_elements = 3 * TRAILING_CHUNK_BYTES / 4
    assert link.max_in_flight[5] <= window_elements + piece
    assert credit_link.max_in_flight[5] > 1.5 * window_elements  # the credit's 4 M elements
    assert finishes[0] < before[0] - 0.006  # 48.7 ms against 57.8
    assert max(finishes.values()) < max(before.values())  # 105.8 ms against 110.9


SPACED_LAYERS = [(3, 0.0, (4000, 1000)), (2, 0.020, (4000, 1000)), (1, 0.040, (1000, 1000)), (0, 0.050, (2, 1000))]


def run_told(cls, link, arrivals, iterations=6, first=0, scheduler=None, told=None):
    """``iterations`` of ``arrivals`` every 0.2 s on ``link``, the scheduler (a new ``cls`` with
    default settings unless given) told the link's rate, or ``told``. Returns the scheduler and each
    iteration's sends as (time after the iteration began, key)."""
    loop = link.loop
    if scheduler is None:
        scheduler = cls(Settings(scheduler=cls.name), loop.clock, link, monitor=ToldLink(serializations=2))
        link.scheduler = scheduler
    scheduler.bandwidth.bytes_per_s = told or link.rate
    run_iterations(scheduler, loop, arrivals, iterations=iterations, period=0.2, first=first)
    sends: dict[int, list] = {}
    for t, task in link.sent:
        sends.setdefault(task.iteration, []).append((round(t - 0.2 * task.iteration, 9), task.key))
    return scheduler, sends


@pytest.mark.parametrize("keeps_up", [True, False])
def test_where_pulls_follow_pushes_a_step_the_link_keeps_up_with_goes_under_the_credit(keeps_up):
    """Where the link carries each layer before the next arrives, nothing queues for a prediction to
    reorder, and on the engines where pulls follow pushes the hold cost CPU (docs/DESIGN.md, "Link
    keeps up"). Such a step is sent exactly as ByteScheduler sends it; held, it is not."""
    _, stock = run_told(ByteScheduler, PullRequestLink(Loop()), SPACED_LAYERS)
    prophet, sends = run_told(Prophet if keeps_up else HeldProphet, PullRequestLink(Loop()), SPACED_LAYERS)
    assert prophet.profiler.profile is not None
    assert (sends[5] == stock[5]) == keeps_up
    assert (prophet._plan is None) == keeps_up
    # every iteration is counted once: planned, or under the credit with its reason (the traces' metadata)
    why = prophet.credit_iterations
    assert prophet.planned_iterations + sum(why.values()) == 6 and why["no profile yet"] >= 1
    assert "bandwidth unknown" not in why
    assert (why["link keeps up"] > 0, prophet.planned_iterations > 0) == (keeps_up, not keeps_up)


def test_where_pulls_follow_pushes_a_link_that_stops_keeping_up_is_held_again():
    """The decision is taken every iteration from the profile and the rate measured then: when the
    link slows to a quarter (16 ms layers now take 64 ms, 20 ms apart), the layers queue past the end
    of backward and Prophet holds again; when it recovers, the credit comes back."""
    link = PullRequestLink(Loop())
    prophet, _ = run_told(Prophet, link, SPACED_LAYERS)
    assert prophet._plan is None
    link.rate = BANDWIDTH / 4
    run_told(Prophet, link, SPACED_LAYERS, first=6, scheduler=prophet)
    assert prophet._plan is not None
    link.rate = BANDWIDTH
    run_told(Prophet, link, SPACED_LAYERS, first=12, scheduler=prophet)
    assert prophet._plan is None


def test_where_pulls_follow_pushes_one_low_rate_reading_does_not_hold_a_step():
    """A completion that waited for a slower peer reads as a slow link; under ByteScheduler's credit
    on BytePS-MXNet resnet b128 1 Gbit/s the readings at the start of an iteration ran 3.4-79 MB/s,
    a third below 20. The rate that decides is one that two of the last five readings reached: three
    low ones in a row do not flip it, a fourth does."""
    link = PullRequestLink(Loop())
    prophet, _ = run_told(Prophet, link, SPACED_LAYERS)
    for it in range(6, 9):
        run_told(Prophet, link, SPACED_LAYERS, iterations=1, first=it, scheduler=prophet, told=BANDWIDTH / 20)
        assert prophet._plan is None
    run_told(Prophet, link, SPACED_LAYERS, iterations=1, first=9, scheduler=prophet, told=BANDWIDTH / 20)
    assert prophet._plan is not None


def test_a_link_that_keeps_up_is_not_decided_where_pulls_do_not_follow_pushes():
    """On all-reduce (gloo, NCCL) and in the simulator the rule does not apply: the step is held."""
    link = FifoLink(Loop(), stages=1)
    link.rate = BANDWIDTH
    prophet, _ = run_told(Prophet, link, SPACED_LAYERS)
    assert prophet.profiler.profile is not None and prophet._plan is not None


def test_where_pulls_follow_pushes_the_first_profiled_iteration_is_already_decided():
    """Rates read before the profile is known count too, so the first iteration with a profile is
    already decided (the torch A/B times iterations 3-7: waiting for two profiled readings held two)."""
    loop = Loop()
    link = PullRequestLink(loop)
    prophet = Prophet(Settings(scheduler="prophet"), loop.clock, link, monitor=ToldLink(serializations=2))
    link.scheduler = prophet
    under_credit = {}
    begin = prophet._begin_iteration

    def recorded_begin(iteration, now):
        begin(iteration, now)
        if prophet.profiler.profile is not None:
            under_credit[iteration] = prophet._plan is None

    prophet._begin_iteration = recorded_begin
    run_iterations(prophet, loop, SPACED_LAYERS, iterations=6, period=0.2)
    assert under_credit and all(under_credit.values())


def test_the_flight_window_is_one_chunk_per_stage_plus_what_the_link_carries_in_the_latency():
    """Where pulls follow pushes, what is in flight may reach one chunk per stage of the link model
    *plus* rate x start-up latency: a push, its request and its pull keep the chunks on the link, and
    a send reaches it only a latency later (Little's law: in flight = rate x (service + latency)). The
    larger of the two, the rule before, left the uplink idle at 10 Gbit/s in the simulator (ResNet-50
    1.21x, VGG-16 1.19x of the default credit; docs/DESIGN.md, "Flight window")."""
    loop = Loop()
    link = PullRequestLink(loop)
    prophet = Prophet(Settings(scheduler="prophet"), loop.clock, link, monitor=ToldLink(serializations=2))
    chunks = prophet._flight_depth
    assert chunks == 3 * TRAILING_CHUNK_BYTES  # push, the request's wait, pull
    prophet.bandwidth.latency = 0.004  # 4 MB at 1 GB/s, more than one chunk, less than three
    latency_bytes = BANDWIDTH * 0.004
    for in_flight, full in ((chunks - 1, False), (chunks + latency_bytes - 1, False), (chunks + latency_bytes, True)):
        prophet.in_flight_bytes = in_flight
        assert prophet._window_full() is full, in_flight
    prophet.bandwidth.latency = 0.0
    prophet.in_flight_bytes = chunks
    assert prophet._window_full()
