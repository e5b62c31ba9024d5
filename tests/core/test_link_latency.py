"""Where pulls follow pushes the link monitor's start-up latency is taken from clean samples only
(core/link.py): an op that found nothing else of ours in flight when sent, and during whose flight
nothing else was sent.
Times are a fake clock (plain seconds); the link below is a FIFO whose ops pay a start-up latency."""
import pytest

from byteps_prophet.core import Task
from byteps_prophet.core.link import LinkMonitor

BW = 25e6  # bytes/s
START = 0.003  # a real start-up latency: the engine's, paid by an op on an idle link


def _task(nbytes, k):
    return Task(f"g{k}", k, (nbytes // 4,))


def measured_rate(monitor, now=0.0):
    """Teach the monitor the link's rate with a stream of back-to-back 1 MB ops; returns the clock."""
    tasks = [_task(1_000_000, 1000 + k) for k in range(12)]
    free = now + START
    monitor.on_send(tasks[0], now)
    for i, t in enumerate(tasks):
        if i + 1 < len(tasks):
            monitor.on_send(tasks[i + 1], free - 0.001)
        free += t.nbytes / BW
        monitor.on_finish(t, free)
    assert monitor.bytes_per_s == pytest.approx(BW, rel=0.05)
    return free + 0.1


def test_an_op_alone_on_an_idle_link_measures_its_latency():
    m = LinkMonitor(pulls_follow_pushes=True)
    now = measured_rate(m)
    for k in range(5):
        t = _task(8_192, k)
        m.on_send(t, now)
        m.on_finish(t, now + START + t.nbytes / BW)
        now += 0.5
    assert m.latency == pytest.approx(START, abs=0.0005)


def test_a_sample_with_a_send_during_its_flight_is_not_taken():
    """The first small op of backward: its pull queues behind the pushes sent during its flight, so its
    time in flight is our own queue, not a start-up."""
    m = LinkMonitor(pulls_follow_pushes=True)
    now = measured_rate(m)
    for k in range(5):
        small, big = _task(40, k), _task(8_000_000, 100 + k)
        m.on_send(small, now)
        m.on_send(big, now + 0.001)  # sent while the small one is in flight
        m.on_finish(small, now + START + big.nbytes / BW)  # pull queued behind the big push
        m.on_finish(big, now + START + 0.001 + big.nbytes / BW)
        now += 1.0
    assert m.latency == 0.0  # the contaminated samples (0.32 s each) were not taken
    # an op sent while another was in flight (that one finishing first) is no sample either
    a, b = _task(1_000_000, 200), _task(40, 201)
    m.on_send(a, now)
    m.on_send(b, now + 0.001)
    m.on_finish(a, now + START + a.nbytes / BW)
    m.on_finish(b, now + 0.5)
    assert m.latency == 0.0


def run_feedback_loop(monitor, iterations=8):
    """Prophet's loop on a link where pulls follow pushes: each iteration sends the first small op of
    backward, then, during its flight, the next gradient's 2 MB chunk plus what it sends ahead of the
    link (``rate x latency``, DESIGN.md "Start-up latency", "Flight window"). The small op's pull waits
    behind all those pushes and completes first; the chunk's pull follows. Returns the latency read
    after each iteration."""
    now = measured_rate(monitor)
    readings = []
    for k in range(iterations):
        small = _task(40, k)
        monitor.on_send(small, now)
        ahead = _task(2_000_000 + int(BW * monitor.latency), 100 + k)
        monitor.on_send(ahead, now + 0.001)
        pushed = now + 0.001 + START + ahead.nbytes / BW
        monitor.on_finish(small, pushed + 0.0001)
        monitor.on_finish(ahead, pushed + ahead.nbytes / BW)
        readings.append(monitor.latency)
        now = pushed + ahead.nbytes / BW + 1.0
    return readings


def test_the_feedback_loop_cannot_start():
    readings = run_feedback_loop(LinkMonitor(pulls_follow_pushes=True))
    assert readings == [0.0] * len(readings)
    # what the rule removes: the monitor as it is on a one-stage link (every op with no completion
    # during its flight a sample) reads its own queue here and grows with it
    grown = run_feedback_loop(LinkMonitor(pulls_follow_pushes=False))
    assert grown[0] > 0.03 and grown[-1] > 3 * grown[0]  # 0.04 s growing to 0.19 s


def test_on_a_one_stage_link_a_later_send_does_not_spoil_the_sample():
    """On gloo's FIFO an op sent later cannot delay an earlier one, and Prophet keeps sending during
    every op's flight: the clean rule would leave no sample at all (measured: 0 instead of 7-13 ms)."""
    m = LinkMonitor(pulls_follow_pushes=False)
    now = measured_rate(m)
    for k in range(5):
        first, later = _task(8_192, k), _task(1_000_000, 100 + k)
        m.on_send(first, now)
        m.on_send(later, now + 0.001)
        done = now + START + first.nbytes / BW
        m.on_finish(first, done)
        m.on_finish(later, done + later.nbytes / BW)
        now += 0.5
    assert m.latency == pytest.approx(START, abs=0.0005)
    # where pulls follow pushes the same ops are no samples
    ps = LinkMonitor(pulls_follow_pushes=True)
    now = measured_rate(ps)
    first, later = _task(8_192, 0), _task(1_000_000, 100)
    ps.on_send(first, now)
    ps.on_send(later, now + 0.001)
    ps.on_finish(first, now + START + first.nbytes / BW)
    ps.on_finish(later, now + START + (first.nbytes + later.nbytes) / BW)
    assert ps.latency == 0.0
