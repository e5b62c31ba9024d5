"""The plugins' WakeupTimer: ticks at the times asked for, the earliest first, and stops cleanly."""
import threading
import time

from byteps_prophet.backends.wakeup import WakeupTimer
from byteps_prophet.core import MonotonicClock


def make_timer():
    clock = MonotonicClock()
    ticks, errors = [], []
    tick_seen = threading.Event()

    def tick():
        ticks.append(clock.now())
        tick_seen.set()

    return clock, WakeupTimer(clock, tick, errors.append), ticks, errors, tick_seen


def test_ticks_at_the_earliest_time_asked_for():
    clock, timer, ticks, errors, tick_seen = make_timer()
    try:
        now = clock.now()
        timer.request(now + 0.5)
        timer.request(now + 0.05)  # earlier: replaces the later one
        timer.request(now + 0.3)  # later than the one pending: changes nothing
        assert tick_seen.wait(2.0)
        time.sleep(0.6)
        assert len(ticks) == 1 and now + 0.05 <= ticks[0] < now + 0.25
        assert not errors
    finally:
        timer.close()


def test_close_stops_the_thread_before_a_pending_tick():
    clock, timer, ticks, _, _ = make_timer()
    timer.request(clock.now() + 0.2)
    timer.close()
    time.sleep(0.3)
    assert ticks == [] and not timer._thread.is_alive()


def test_a_failing_tick_is_reported_once_and_ends_the_timer():
    clock = MonotonicClock()
    errors = []

    def tick():
        raise RuntimeError("send failed")

    timer = WakeupTimer(clock, tick, errors.append)
    timer.request(clock.now())
    timer._thread.join(2.0)
    assert not timer._thread.is_alive() and [str(e) for e in errors] == ["send failed"]
    timer.close()


def test_no_thread_until_a_scheduler_asks():
    """FIFO and ByteScheduler never ask for a tick: their runs keep the threads they had."""
    clock, timer, _, _, tick_seen = make_timer()
    assert timer._thread is None
    timer.request(clock.now())
    assert tick_seen.wait(2.0) and timer._thread.is_alive()
    timer.close()
    assert not timer._thread.is_alive()
