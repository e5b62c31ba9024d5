"""Prophet's fused collectives (docs/DESIGN.md, "Fused collectives"): on an all-reduce engine, whose
every message costs a collective's fixed time, the most urgent pending pieces go as one message.
Fake clock, in-memory transport."""
from collections import Counter

import pytest

from byteps_prophet.core import EngineTraits, Prophet, Settings, Task
from byteps_prophet.core.task import Fused, State
from tests.core.test_prophet_default import Loop, run_iterations

COLLECTIVE_S = 2e-3  # each message's fixed cost: a ring collective's start-ups
BANDWIDTH = 1e9


class CollectiveLink:
    """One FIFO stage; every message, fused or not, costs ``COLLECTIVE_S`` plus its bytes."""

    def __init__(self, loop: Loop, stages: int = 1, accepts_fused: bool = True, cost: float = COLLECTIVE_S) -> None:
        self.loop, self.cost = loop, cost
        self.traits = EngineTraits(stages=stages)
        self.accepts_fused = accepts_fused
        self.free = 0.0
        self.sent: list[tuple[float, object]] = []
        self.scheduler = None

    def send(self, message):
        now = self.loop.clock.now()
        self.sent.append((now, message))
        self.free = max(self.free, now) + self.cost + message.nbytes / BANDWIDTH
        self.loop.at(self.free, self.scheduler.finished, message)


# 24 gradients of 40 KB 0.2 ms apart (a burst of small layers), then gradient 0 at the end (5 ms).
ARRIVALS = [(i, 0.0002 * (24 - i), (10, 1000)) for i in range(24, 0, -1)] + [(0, 0.005, (10, 1000))]


def run(stages=1, accepts_fused=True, mode="default", iterations=6, period=0.2, fuse=True):
    loop = Loop()
    link = CollectiveLink(loop, stages, accepts_fused)
    scheduler = Prophet(Settings(scheduler="prophet", prophet_mode=mode, fuse=fuse), loop.clock, link)
    link.scheduler = scheduler
    done = Counter()
    finish = {}

    def on_done(task):
        done[(task.iteration, task.index)] += 1
        finish[task.iteration] = max(finish.get(task.iteration, 0.0), loop.clock.now() - task.iteration * period)

    scheduler.on_done = on_done
    run_iterations(scheduler, loop, ARRIVALS, iterations=iterations, period=period)
    assert scheduler._plan is not None  # the last iterations were scheduled by the prediction
    return scheduler, link, done, finish


def members(message):
    return message.members if isinstance(message, Fused) else [message]


def test_fuses_pending_pieces_into_one_collective_each_row_once():
    scheduler, link, done, finish = run()
    last = [m for _, m in link.sent if m.iteration == 5]
    fused = [m for m in last if isinstance(m, Fused)]
    assert fused, "no fused collective in a profiled iteration"
    assert len(last) < len(ARRIVALS) / 2  # far fewer collectives than gradients
    # every gradient of every iteration done exactly once, every row sent exactly once
    assert set(done.values()) == {1} and len(done) == 6 * len(ARRIVALS)
    rows = Counter()
    for _, message in link.sent:
        assert message.state is State.FINISHED
        for piece in members(message):
            assert piece.state is State.FINISHED
            rows[(piece.iteration, piece.index)] += piece.rows
    assert all(count == 10 for count in rows.values()) and len(rows) == 6 * len(ARRIVALS)
    # a fused collective carries the most urgent pending pieces in priority order, one iteration each
    for message in fused:
        priorities = [piece.priority for piece in message.members]
        assert priorities == sorted(priorities)
        assert {piece.iteration for piece in message.members} == {message.iteration}
        assert message.nbytes == sum(piece.nbytes for piece in message.members)
    assert scheduler.in_flight_count == 0 and scheduler.in_flight_bytes == 0


def test_fusion_ends_the_step_sooner_on_a_collective_engine():
    _, fused_link, _, fused = run()
    _, alone_link, _, alone = run(accepts_fused=False)
    assert not any(isinstance(m, Fused) for _, m in alone_link.sent)
    assert len(fused_link.sent) < len(alone_link.sent)
    # 25 collectives of 2 ms against a handful: the last gradient is done several ms sooner
    assert fused[5] < alone[5] - 0.010, (fused[5], alone[5])


@pytest.mark.parametrize("stages, accepts_fused, mode, fuse", [(2, True, "default", True), (1, False, "default", True),
                                                               (1, True, "paper", True), (1, True, "default", False)])
def test_no_fusion_on_parameter_servers_plain_transports_the_paper_mode_or_unasked(stages, accepts_fused, mode, fuse):
    """A parameter server's message is not a collective (its rules stay as they were), a transport
    that cannot carry a fused message never gets one, the paper mode stays as published, and without
    BYTEPS_PROPHET_FUSE (the default) nothing is fused, in training and in the simulator alike."""
    _, link, done, _ = run(stages, accepts_fused, mode, fuse=fuse)
    assert not any(isinstance(m, Fused) for _, m in link.sent)
    assert set(done.values()) == {1} and len(done) == 6 * len(ARRIVALS)


def test_a_fused_message_is_started_and_finished_whole():
    """The base scheduler's bookkeeping: one message in flight, its members started together; a
    member that is not ready cannot be fused, and a fused message cannot finish twice."""
    loop = Loop()
    link = CollectiveLink(loop)
    scheduler = Prophet(Settings(scheduler="prophet", fuse=True), loop.clock, link)
    link.scheduler = scheduler
    a, b = Task("a", 1, (4, 10)), Task("b", 2, (4, 10))
    for task in (a, b):
        task.state = State.READY
    message = Fused([a.slice(0, 4), b.slice(0, 4)])
    scheduler._start(message)
    assert scheduler.in_flight_count == 1 and scheduler.in_flight_bytes == 320
    assert all(p.state is State.STARTED for p in message.members) and a.state is State.STARTED
    loop.run_until()
    assert message.state is State.FINISHED and a.state is State.FINISHED and b.state is State.FINISHED
    with pytest.raises(ValueError):
        scheduler.finished(message)
    with pytest.raises(RuntimeError):
        scheduler._start(Fused([Task("c", 3, (2,)).slice(0, 2), message.members[0]]))


def test_after_the_end_of_backward_pieces_are_fused_never_cut():
    """A real engine's collective costs more than the fixed cost its monitor measures (its start-up
    latency is tracked apart), so after the end of backward the fused drain never cuts a queued piece
    into smaller collectives, however small the measured cost makes its chunk; it only fuses. 40 MB of
    backlog at the end, four small gradients before it, and gradient 0 (10 MB, three 1 M-element
    pieces) arriving at the end, on a link whose collectives cost 10 us."""
    loop = Loop()
    link = CollectiveLink(loop, cost=1e-5)
    scheduler = Prophet(Settings(scheduler="prophet", fuse=True), loop.clock, link)
    link.scheduler = scheduler
    arrivals = ([(5, 0.0, (10000, 1000))] + [(i, 0.0045 + 1e-4 * (5 - i), (10, 1000)) for i in (4, 3, 2, 1)]
                + [(0, 0.005, (2500, 1000))])
    run_iterations(scheduler, loop, arrivals, iterations=6, period=0.2)
    assert scheduler._plan is not None
    drained = [m for t, m in link.sent if m.iteration == 5 and t >= 1.005 - 1e-9]
    grad0 = sorted((p.row_start, p.row_end) for m in drained for p in members(m) if p.index == 0)
    assert grad0 == [(0, 833), (833, 1666), (1666, 2500)], grad0  # ByteScheduler's partition, uncut
    assert scheduler._drain_chunk < 833 * 1000 * 4  # the chunk would have cut them
    assert any(isinstance(m, Fused) for _, m in link.sent if m.iteration == 5)  # small ones still fused


# A 4 MB gradient, a small one 1.5 ms before the end of backward, then gradient 0 (DESIGN.md, "Fused
# collectives", "Gradient 0's collective"): the small one's collective could not end before gradient 0
# arrives (2 ms of fixed cost alone), so it waits for gradient 0 and both go as one.
LATE_ARRIVALS = [(2, 0.0, (1000, 1000)), (1, 0.0485, (10, 1000)), (0, 0.050, (10, 1000))]


def run_late(late_by=0.0, iterations=6, period=0.2):
    loop = Loop()
    link = CollectiveLink(loop)
    scheduler = Prophet(Settings(scheduler="prophet", fuse=True, partition=10**9), loop.clock, link)
    link.scheduler = scheduler
    scheduler.on_wakeup = lambda t: loop.at(t, scheduler.tick)
    for it in range(iterations):
        t0 = it * period
        arrivals = LATE_ARRIVALS if it < iterations - 1 else LATE_ARRIVALS[:2] + [(0, 0.050 + late_by, (10, 1000))]
        for index, offset, shape in arrivals:
            loop.at(t0 + offset, scheduler.post, Task(f"g{index}", index, shape, iteration=it))
        loop.at(t0 + arrivals[-1][1], scheduler.end_of_backward, it)
    loop.run_until()
    assert scheduler._plan is not None
    t0 = (iterations - 1) * period
    return [(t - t0, [piece.index for piece in members(message)]) for t, message in link.sent
            if message.iteration == iterations - 1]


def test_a_collective_that_would_delay_gradient_0_waits_for_it_and_goes_with_it():
    sent = run_late()
    assert sent[-1] == (pytest.approx(0.050, abs=1e-9), [0, 1])  # one collective, at gradient 0's arrival
    assert sorted(i for _, indices in sent for i in indices) == [0, 1, 2]  # each gradient once


def test_a_late_gradient_0_is_waited_for_one_fixed_cost_at_most():
    sent = run_late(late_by=0.010)  # predicted at 50 ms, arrives at 60
    times = {tuple(indices): t for t, indices in sent}
    assert times[(1,)] == pytest.approx(0.050 + COLLECTIVE_S, abs=1e-6)  # held no longer than that
    assert times[(0,)] == pytest.approx(0.060, abs=1e-6)
