"""BandwidthMonitor against a synthetic FIFO link whose bandwidth and per-message cost are known."""
import heapq

import pytest

from byteps_prophet.core.bandwidth import BandwidthMonitor
from byteps_prophet.core.task import Task

COST = 50e-6


class FifoLink:
    """``stages`` FIFO stages in series (push, pull); each serves a message in cost + bytes/bandwidth."""

    def __init__(self, stages: int, bandwidth: float) -> None:
        self.free = [0.0] * stages
        self.bandwidth = bandwidth

    def finish_time(self, sent: float, nbytes: int) -> float:
        done = sent
        for j, free in enumerate(self.free):
            done = self.free[j] = max(free, done) + COST + nbytes / self.bandwidth
        return done


def drive(monitor: BandwidthMonitor, link: FifoLink, sends: list[tuple[float, int]]) -> None:
    """Feed the monitor the send and finish events of ``sends`` (time, bytes) in time order."""
    events = []
    for k, (t, nbytes) in enumerate(sends):
        task = Task(f"g{k}", k, (nbytes // 4,))
        heapq.heappush(events, (t, 0, k, task))
        heapq.heappush(events, (link.finish_time(t, nbytes), 1, k, task))
    while events:
        t, kind, _, task = heapq.heappop(events)
        (monitor.on_send if kind == 0 else monitor.on_finish)(task, t)


def sizes(n: int, seed: int = 1) -> list[int]:
    return [4 * (1000 + (seed * 7919 * k) % 250_000) for k in range(1, n + 1)]


@pytest.mark.parametrize("stages", [1, 2])
def test_recovers_bandwidth_and_cost_from_lone_transfers(stages):
    monitor, link = BandwidthMonitor(serializations=stages), FifoLink(stages, 1.25e9)
    drive(monitor, link, [(0.01 * k, b) for k, b in enumerate(sizes(40))])  # each runs alone
    assert monitor.bytes_per_s == pytest.approx(1.25e9, rel=0.01)
    assert monitor.message_cost == pytest.approx(COST, rel=0.05)


@pytest.mark.parametrize("stages", [1, 2])
def test_recovers_bandwidth_and_cost_through_queueing(stages):
    monitor, link = BandwidthMonitor(serializations=stages), FifoLink(stages, 3e9 / 8)
    # Bursts: several transfers sent together queue behind each other, then a pause.
    sends = [(0.05 * (k // 5), b) for k, b in enumerate(sizes(60, seed=3))]
    drive(monitor, link, sends)
    assert monitor.bytes_per_s == pytest.approx(3e9 / 8, rel=0.01)
    assert monitor.message_cost == pytest.approx(COST, rel=0.05)


def test_follows_a_bandwidth_drop():
    monitor, link = BandwidthMonitor(serializations=2), FifoLink(2, 10e9 / 8)
    drive(monitor, link, [(0.002 * k, b) for k, b in enumerate(sizes(64))])
    assert monitor.bytes_per_s == pytest.approx(10e9 / 8, rel=0.01)
    link.bandwidth = 3e9 / 8
    drive(monitor, link, [(1.0 + 0.01 * k, b) for k, b in enumerate(sizes(64, seed=5))])
    assert monitor.bytes_per_s == pytest.approx(3e9 / 8, rel=0.01)


def test_unknown_until_a_transfer_completes():
    monitor = BandwidthMonitor()
    assert not monitor.known and monitor.bytes_per_s is None and monitor.message_cost == 0.0
