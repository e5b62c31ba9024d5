"""Network cost models of one representative worker in a symmetric cluster.

Every worker runs the same schedule, so simulating one worker and charging the shared resources
(server links, the ring) for all of them is exact for a homogeneous cluster and keeps the simulator
fast at any scale. Links are FIFO and full duplex; each message pays a fixed ``overhead`` on every
link it occupies (per-message processing cost) plus its bytes over the link's bandwidth, and one-way
``latency`` (propagation, not occupying the link). With bandwidth on a schedule, a message is charged
at the bandwidth in force when it starts on a link.
"""
from __future__ import annotations

from typing import Callable

ARCHITECTURES = ("ps", "allreduce")


class Conditions:
    """Bandwidth (bytes/s) and compute slowdown, each a step function of simulated time."""

    def __init__(self, bandwidth: float, bandwidth_steps=(), compute_steps=()) -> None:
        self._bandwidth = sorted([(0.0, bandwidth), *bandwidth_steps])
        self._compute = sorted([(0.0, 1.0), *compute_steps])

    @staticmethod
    def _at(steps, t: float) -> float:
        value = steps[0][1]
        for start, v in steps:
            if start > t:
                break
            value = v
        return value

    def bandwidth(self, t: float) -> float:
        if len(self._bandwidth) == 1:
            return self._bandwidth[0][1]
        return self._at(self._bandwidth, t)

    def compute_factor(self, t: float) -> float:
        if len(self._compute) == 1:
            return 1.0
        return self._at(self._compute, t)

    @property
    def base_bandwidth(self) -> float:
        return self._bandwidth[0][1]


class ParameterServerNetwork:
    """Push to servers, then pull: worker uplink -> server ingress, server egress -> worker downlink.

    A message is striped over the ``servers`` (as BytePS spreads keys), so each server link carries
    ``workers / servers`` times what one worker's link carries."""

    serializations = 2

    def __init__(self, workers: int, servers: int, conditions: Conditions, overhead: float, latency: float,
                 schedule: Callable[[float, Callable, object], None], now: Callable[[], float]) -> None:
        self.fan_in = workers / servers
        self.conditions, self.overhead, self.latency = conditions, overhead, latency
        self._schedule, self._now = schedule, now
        self._up = self._server_in = self._server_out = self._down = 0.0
        self.on_finished: Callable = lambda task: None

    def send(self, task) -> None:
        t = self._now()
        nbytes = task.nbytes
        o = self.overhead
        up_start = max(t, self._up)
        wire = nbytes / self.conditions.bandwidth(up_start)
        self._up = up_end = up_start + o + wire
        server_start = max(up_start, self._server_in)
        self._server_in = pushed = max(up_end, server_start + o + self.fan_in * wire)
        pushed += self.latency
        egress_start = max(pushed, self._server_out)
        egress_wire = nbytes / self.conditions.bandwidth(egress_start)
        self._server_out = egress_end = egress_start + o + self.fan_in * egress_wire
        down_start = max(pushed, self._down)
        self._down = pulled = max(egress_end, down_start + o + egress_wire)
        self._schedule(pulled + self.latency, self.on_finished, task)

    def sync_time(self, nbytes: int, bandwidth: float) -> float:
        """Least time to push and pull ``nbytes`` on an idle network, however finely it is cut: at
        least one push and one pull message, and the bytes pipelined through the bottleneck once."""
        return 2 * (self.overhead + self.latency) + max(1.0, self.fan_in) * nbytes / bandwidth

    def comm_time(self, nbytes: int, bandwidth: float) -> float:
        """The bottleneck link's busy time for ``nbytes`` per worker per iteration (each direction)."""
        return max(1.0, self.fan_in) * nbytes / bandwidth


class RingAllReduceNetwork:
    """One collective at a time over a ring of ``workers``: 2(n-1) steps, each moving 1/n of the
    message over every link and paying ``overhead + latency``."""

    serializations = 1

    def __init__(self, workers: int, conditions: Conditions, overhead: float, latency: float,
                 schedule: Callable[[float, Callable, object], None], now: Callable[[], float]) -> None:
        self.workers = workers
        self.conditions, self.overhead, self.latency = conditions, overhead, latency
        self._schedule, self._now = schedule, now
        self._free = 0.0
        self.on_finished: Callable = lambda task: None

    def _duration(self, nbytes: int, bandwidth: float) -> float:
        n = self.workers
        if n == 1:
            return self.overhead
        return 2 * (n - 1) * (self.overhead + self.latency) + 2 * (n - 1) / n * nbytes / bandwidth

    def send(self, task) -> None:
        start = max(self._now(), self._free)
        self._free = start + self._duration(task.nbytes, self.conditions.bandwidth(start))
        self._schedule(self._free, self.on_finished, task)

    def sync_time(self, nbytes: int, bandwidth: float) -> float:
        return self._duration(nbytes, bandwidth)

    def comm_time(self, nbytes: int, bandwidth: float) -> float:
        n = self.workers
        return 2 * (n - 1) / n * nbytes / bandwidth if n > 1 else 0.0
