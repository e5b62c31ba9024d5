"""DDP's buckets and Horovod's fusion (sim/baselines.py): what each sends when, and that every
gradient is synchronised and reported exactly once."""
import pytest

from byteps_prophet.core import ManualClock, Task
from byteps_prophet.sim.baselines import MIB, Collective, DDPBuckets, HorovodFusion


class Link:
    """Remembers each collective; the test finishes them."""

    def __init__(self) -> None:
        self.sent: list[Collective] = []
        self.in_flight: list[Collective] = []

    def send(self, collective) -> None:
        self.sent.append(collective)
        self.in_flight.append(collective)


def grad(index, nbytes, iteration=0):
    return Task(f"g{index}", index, (nbytes // 4,), iteration=iteration)


def make(cls, **kw):
    clock, link, done = ManualClock(), Link(), []
    return clock, link, done, cls(clock, link, done.append, **kw)


def finish_all(sched, link, clock=None, after=0.0):
    while link.in_flight:
        if clock is not None:
            clock.advance(after)
        sched.finished(link.in_flight.pop(0))


def test_ddp_fills_buckets_in_ready_order_and_sends_the_partial_one_at_the_end_of_backward():
    clock, link, done, ddp = make(DDPBuckets, bucket_bytes=10 * MIB, first_bucket_bytes=1 * MIB)
    sizes = [3 * MIB, 6 * MIB, 5 * MIB, 4 * MIB, 2 * MIB]  # backward order: index 4 first
    tasks = [grad(4 - k, s) for k, s in enumerate(sizes)]
    ddp.post(tasks[0])
    assert [c.nbytes for c in link.sent] == [3 * MIB]  # the first bucket's cap is 1 MiB: one gradient fills it
    ddp.post(tasks[1])
    assert len(link.sent) == 1  # 6 MiB < 10 MiB: still filling
    ddp.post(tasks[2])
    assert [c.nbytes for c in link.sent] == [3 * MIB, 11 * MIB]  # 6 + 5 >= 10: full, one gradient over
    ddp.post(tasks[3])
    ddp.post(tasks[4])
    assert len(link.sent) == 2
    ddp.end_of_backward(0)
    assert [[t.index for t in c.members] for c in link.sent] == [[4], [3, 2], [1, 0]]
    finish_all(ddp, link)
    assert sorted(t.index for t in done) == [0, 1, 2, 3, 4]
    assert ddp.bytes_sent == sum(sizes)


def test_ddp_reports_an_iteration_done_only_when_all_of_it_is_synchronised():
    clock, link, done, ddp = make(DDPBuckets, bucket_bytes=1 * MIB)
    for k in range(3):
        ddp.post(grad(2 - k, 2 * MIB))
    assert len(link.sent) == 3
    ddp.finished(link.in_flight.pop(0))
    ddp.finished(link.in_flight.pop(0))
    assert done == []  # the backward is not over: DDP's backward() has not returned
    ddp.end_of_backward(0)
    assert done == []  # one bucket still in flight
    ddp.finished(link.in_flight.pop(0))
    assert [t.index for t in done] == [2, 1, 0]


def test_without_the_barrier_each_gradient_is_done_with_its_bucket():
    clock, link, done, ddp = make(DDPBuckets, bucket_bytes=1 * MIB, barrier=False)
    ddp.post(grad(1, 2 * MIB))
    ddp.finished(link.in_flight.pop(0))
    assert [t.index for t in done] == [1]


def test_a_collective_finished_twice_or_never_sent_is_refused():
    clock, link, done, ddp = make(DDPBuckets, bucket_bytes=1)
    ddp.post(grad(0, 8))
    collective = link.in_flight.pop(0)
    ddp.finished(collective)
    with pytest.raises(ValueError):
        ddp.finished(collective)
    with pytest.raises(ValueError):
        ddp.post(collective.members[0])  # posted twice


def test_horovod_fuses_what_is_ready_at_each_cycle_up_to_the_buffer():
    clock, link, done, hvd = make(HorovodFusion, cycle_s=0.005, fusion_bytes=10 * MIB)
    wakeups = []
    hvd.on_wakeup = wakeups.append
    clock.set(0.001)
    for k, size in enumerate([4 * MIB, 4 * MIB, 4 * MIB, 20 * MIB]):
        hvd.post(grad(10 - k, size))
    assert link.sent == [] and wakeups == [0.005]  # waits for the loop's next cycle
    clock.set(0.005)
    hvd.tick()
    # 4+4 fit the buffer, the third starts a new fusion, the 20 MiB gradient goes alone
    assert [[t.index for t in c.members] for c in link.sent] == [[10, 9], [8], [7]]
    clock.set(0.0052)
    hvd.post(grad(3, 1 * MIB))
    assert len(link.sent) == 3  # the loop is busy with its cycle's collectives
    clock.set(0.02)
    finish_all(hvd, link)
    # the cycle's collectives took longer than a cycle: the next starts as soon as they are done
    assert [[t.index for t in c.members] for c in link.sent][-1] == [3]
    hvd.end_of_backward(0)
    finish_all(hvd, link)
    assert sorted(t.index for t in done) == [3, 7, 8, 9, 10]


def test_horovod_keeps_its_beat_after_a_short_cycle():
    clock, link, done, hvd = make(HorovodFusion, cycle_s=0.010, fusion_bytes=MIB)
    wakeups = []
    hvd.on_wakeup = wakeups.append
    clock.set(0.0)
    hvd.post(grad(1, 64))
    assert [c.nbytes for c in link.sent] == [64]  # a cycle is due at 0: sent at once
    clock.set(0.002)
    finish_all(hvd, link)
    clock.set(0.013)
    hvd.post(grad(0, 64))
    assert wakeups == [0.020]  # the loop slept to 0.010, then wakes at 0.020


def test_fusion_zero_sends_every_gradient_alone():
    clock, link, done, hvd = make(HorovodFusion, cycle_s=0.001, fusion_bytes=0)
    hvd.on_wakeup = lambda t: None
    clock.set(0.0005)
    for k in range(3):
        hvd.post(grad(2 - k, 16))
    clock.set(0.001)
    hvd.tick()
    assert [len(c.members) for c in link.sent] == [1, 1, 1]


@pytest.mark.parametrize("cls, kw", [(DDPBuckets, {"bucket_bytes": 0}), (HorovodFusion, {"cycle_s": 0}),
                                     (HorovodFusion, {"fusion_bytes": -1})])
def test_invalid_knobs_name_themselves(cls, kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        make(cls, **kw)


def test_many_iterations_every_gradient_once_by_sums():
    """Random sizes, several iterations, finishing in between: nothing sent twice, nothing lost."""
    import random

    rng = random.Random(7)
    for cls, kw in [(DDPBuckets, {"bucket_bytes": 3000}), (HorovodFusion, {"cycle_s": 0.001, "fusion_bytes": 3000})]:
        clock, link, done, sched = make(cls, **kw)
        sched.on_wakeup = None
        posted = 0
        for it in range(5):
            for index in reversed(range(20)):
                task = grad(index, 4 * rng.randint(1, 800), iteration=it)
                posted += task.nbytes
                clock.advance(0.0003)
                sched.post(task)
                if link.in_flight and rng.random() < 0.5:
                    sched.finished(link.in_flight.pop(0))
            sched.end_of_backward(it)
            finish_all(sched, link, clock, 0.0001)
        assert sched.bytes_sent == posted == sum(c.nbytes for c in link.sent)
        assert sorted((t.iteration, t.index) for t in done) == [(it, i) for it in range(5) for i in range(20)]
        assert all(len(c.members) >= 1 and len({t.iteration for t in c.members}) == 1 for c in link.sent)
