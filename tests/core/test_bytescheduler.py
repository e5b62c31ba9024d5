import math

from byteps_prophet.core import State


def test_fifo_sends_each_gradient_whole_in_ready_order(harness):
    h = harness(scheduler="fifo")
    h.post("b", 1, (3_000_000,))
    h.post("a", 0, (5,))
    assert [(p.name, p.numel) for p in h.transport.sent] == [("b", 3_000_000), ("a", 5)]


def test_credit_overdraws_by_exactly_one_task_then_waits(harness):
    h = harness(scheduler="bytescheduler", partition=100, credit=250)
    h.post("g", 5, (1000,))  # ten pieces of 100
    # 250 -> 150 -> 50 -> -50: the third piece overdraws, the fourth waits.
    assert len(h.transport.sent) == 3
    assert h.scheduler.credit == -50
    h.finish()  # credit back to 50: one more piece goes
    assert len(h.transport.sent) == 4 and h.scheduler.credit == -50


def test_credit_never_exceeds_its_limit(harness):
    h = harness(scheduler="bytescheduler", partition=100, credit=1000)
    h.post("g", 0, (300,))
    while h.transport.in_flight:
        h.finish()
    assert h.scheduler.credit == 1000


def test_credit_equal_to_piece_size_sends_each_piece_exactly_once(harness):
    h = harness(scheduler="bytescheduler", partition=100, credit=100)
    task = h.post("g", 0, (500,))
    while h.transport.in_flight:
        h.finish()
    assert [p.key for p in h.transport.sent] == [f"g[{i}:{i + 100}]" for i in range(0, 500, 100)]
    assert task.state is State.FINISHED and h.done == [task]


def test_most_urgent_first_and_ties_keep_arrival_order(harness):
    h = harness(scheduler="bytescheduler", partition=1_000_000, credit=1)
    h.post("late_layer", 9, (10,))  # goes at once (credit 1 > 0) and overdraws
    h.post("x", 4, (10,))
    h.post("first_layer", 0, (10,))
    h.post("y", 4, (10,))  # same priority as x: must not compare Task objects, x stays first
    for _ in range(3):
        h.finish()
    assert [p.name for p in h.transport.sent] == ["late_layer", "first_layer", "x", "y"]


def test_set_credit_keeps_what_is_in_flight_charged(harness):
    h = harness(scheduler="bytescheduler", partition=100, credit=100)
    h.post("g", 0, (300,))
    assert h.scheduler.credit == 0
    h.scheduler.set_credit(300)
    assert h.scheduler.credit == 200


def test_a_time_asked_for_again_after_a_tick_reaches_the_timer(harness):
    """``on_wakeup`` is passed each time once between ticks. The plugins' timer keeps only its earliest
    time, so a later time asked for before a tick is dropped there; after the tick the scheduler
    must pass it on again, or it would wait for a tick that never comes."""
    scheduler = harness(scheduler="fifo").scheduler
    asked = []
    scheduler.on_wakeup = asked.append
    scheduler._wake_at(1.0)
    scheduler._wake_at(2.0)  # a timer keeping the earliest time drops this one
    scheduler._wake_at(2.0)  # the same time once between ticks
    scheduler.tick()  # at 1.0
    scheduler._wake_at(2.0)
    assert asked == [1.0, 2.0, 2.0]


def test_tune_credit_scores_each_probe_by_its_steps_after_a_transition_step():
    """The benchmarks' one tuning loop: a probe's first step (the credit changing) is not scored, the
    next ``probe_steps`` are, and the credit whose steps were fastest is kept."""
    from byteps_prophet.core import ManualClock
    from byteps_prophet.core.tuning import credit_bounds, tune_credit

    clock, state, steps = ManualClock(), {"credit": None, "fresh": False}, []

    def set_credit(credit):
        state.update(credit=credit, fresh=True)

    def step():  # fastest at 2 M elements; the transition step costs 10 s, unscored
        steps.append(state["credit"])
        clock.advance(10.0 if state["fresh"] else 1.0 + abs(math.log2(state["credit"] / 2e6)))
        state["fresh"] = False

    result = tune_credit(credit_bounds(1_000_000, 64_000_000), (6, 3), 2, set_credit, step, lambda: None, clock)
    assert result["credit_bounds"] == [250_000, 64_000_000] and len(result["probes"]) == 9
    assert len(steps) == 9 * 3
    assert all(mean < 10 for _, mean in result["probes"])  # the transition step never scored
    best = min(result["probes"], key=lambda p: p[1])
    assert result["best_credit"] == best[0] and abs(math.log2(best[0] / 2e6)) < 1
