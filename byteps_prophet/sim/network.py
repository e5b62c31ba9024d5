"""Network cost models of one representative worker, driven by the engine's traits.

Every worker runs the same schedule, so simulating one worker and charging the shared resources
(server links, the ring) for all of them is exact for a homogeneous cluster and keeps the simulator
fast at any scale (stragglers: the engine's compute model, ``sim/engine.py``). Links are FIFO; each
message pays the engine's ``message_cost_s`` on every link it occupies (once per atom where the plugin
sends Prophet's fixed atoms, ``use_atoms``) plus its bytes over the link's bandwidth, and one-way ``latency`` (propagation, not
occupying the link). An op reaches the link only ``startup_latency_s`` after it is sent; ops already
queued overlap that wait. With bandwidth on a schedule, a message is charged at the bandwidth in force
when it starts on a link, over the engine's ``comm_slowdown`` if the worker computes when it is sent.
"""
from __future__ import annotations

import math
from typing import Callable

from byteps_prophet.core.engine import EngineTraits

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


class _Network:
    def __init__(self, traits: EngineTraits, conditions: Conditions, latency: float,
                 schedule: Callable[[float, Callable, object], None], now: Callable[[], float]) -> None:
        self.traits = traits
        self.conditions, self.latency = conditions, latency
        self.overhead = traits.message_cost_s
        self._schedule, self._now = schedule, now
        self.on_finished: Callable = lambda task: None
        self.in_flight = 0  # messages sent and not yet finished
        self._atom_elements = 0  # the plugin's fixed atoms, 0: one message per piece (``use_atoms``)
        self.computing: Callable[[], bool] = lambda: False  # whether the worker computes (the simulation's)

    def rate(self, t: float) -> float:
        """The link's bytes/s for a message starting at ``t``: the conditions' bandwidth, over the
        engine's ``comm_slowdown`` while the worker computes."""
        bandwidth = self.conditions.bandwidth(t)
        return bandwidth / self.traits.comm_slowdown if self.computing() else bandwidth

    def _done_at(self, when: float, task) -> None:
        self._schedule(when, self._finished, task)

    def _finished(self, task) -> None:
        self.in_flight -= 1
        self.on_finished(task)

    def use_atoms(self, elements: int) -> None:
        """Pieces go out as fixed atoms of ``elements``, one message each, as the plugins send Prophet's
        cuts (``Backend.use_atoms``); the other schedulers' pieces are one message."""
        self._atom_elements = elements

    def _messages(self, task) -> int:
        """Messages the engine sends for ``task``: one, or one per fixed atom it covers."""
        atom = self._atom_elements
        if not atom:
            return 1
        numel = getattr(task, "numel", task.nbytes // 4)  # a fused collective counts float32 elements
        return max(1, math.ceil(numel / atom))


class _Timeline:
    """When a FIFO link frees."""
    __slots__ = ("free",)

    def __init__(self) -> None:
        self.free = 0.0


class ParameterServerNetwork(_Network):
    """Push to servers, then pull: worker uplink -> server ingress, server egress -> worker downlink.

    A message is striped over the servers (as BytePS spreads keys), so each server link carries
    ``workers / servers`` times what one worker's link carries. Where pulls follow pushes, the pull is
    requested over the worker's uplink once the push is acknowledged, behind every byte queued there
    by then; without duplex links a worker's push and pull share one link. With ``backpressure`` the
    worker's queue drains only as the server's ingress takes the pushes (``workers / servers`` of them
    share it), so that request waits for the server to have every push queued before it: a burst of
    pushes completes before its first pull starts (docs/ENGINE.md). A server link's direction runs at
    ``duplex_efficiency`` of its rate while the other direction is busy too. With ``pull_in_reply`` the
    server answers the push with the values (MXNet's ``pushpull``): no pull request, the pull leaves
    the server as soon as it has every worker's push."""

    def __init__(self, workers: int, traits: EngineTraits, conditions: Conditions, latency: float,
                 schedule, now) -> None:
        super().__init__(traits, conditions, latency, schedule, now)
        self.fan_in = workers / (traits.servers or workers)
        self._up, self._server_in, self._server_out = _Timeline(), _Timeline(), _Timeline()
        self._down = _Timeline() if traits.duplex else self._up

    def send(self, task) -> None:
        self.in_flight += 1
        nbytes, cost = task.nbytes, self.overhead * self._messages(task)
        up = self._up
        up_start = max(self._now() + self.traits.startup_latency_s, up.free)
        wire = nbytes / self.rate(up_start)
        up.free = up_end = up_start + cost + wire
        server_start = max(up_start, self._server_in.free)
        ingress = self._stretched(server_start + cost, self.fan_in * wire, self._server_out.free)
        self._server_in.free = pushed = max(up_end, server_start + cost + ingress)
        if self.traits.backpressure:  # the worker's queue drains at the pace the server takes it
            up.free = pushed
        pushed += self.latency
        if self.traits.pulls_follow_pushes and not self.traits.pull_in_reply:
            self._schedule(pushed, self._request_pull, (task, cost))
        else:
            self._pull(task, cost, pushed)

    def _request_pull(self, item) -> None:
        task, cost = item
        up = self._up
        up.free = requested = max(self._now(), up.free) + cost
        self._pull(task, cost, requested + self.latency)

    def _pull(self, task, cost: float, ready: float) -> None:
        nbytes = task.nbytes
        egress_start = max(ready, self._server_out.free)
        egress_wire = nbytes / self.rate(egress_start)
        egress = self._stretched(egress_start + cost, self.fan_in * egress_wire, self._server_in.free)
        self._server_out.free = egress_end = egress_start + cost + egress
        down = self._down
        down_start = max(ready, down.free)
        down.free = pulled = max(egress_end, down_start + cost + egress_wire)
        self._done_at(pulled + self.latency, task)

    def _stretched(self, start: float, work: float, other_busy_until: float) -> float:
        """Seconds a server link needs for ``work`` seconds of its undivided rate from ``start``, the
        other direction busy until ``other_busy_until``: at ``duplex_efficiency`` of its rate while both
        are, at its full rate after (what the other direction books later is not looked ahead at)."""
        e = self.traits.duplex_efficiency
        if e >= 1 or other_busy_until <= start:
            return work
        both = other_busy_until - start
        return work / e if work <= e * both else both + (work - e * both)

    def sync_time(self, nbytes: int, bandwidth: float) -> float:
        """Least time to push and pull ``nbytes`` on an idle network, however finely it is cut: at
        least one push and one pull message, and the bytes pipelined through the bottleneck once."""
        return 2 * (self.overhead + self.latency) + max(1.0, self.fan_in) * nbytes / bandwidth

    def comm_time(self, nbytes: int, bandwidth: float) -> float:
        """The bottleneck link's busy time for ``nbytes`` per worker per iteration (each direction)."""
        duplex = 1 if self.traits.duplex else 2
        return duplex * max(1.0, self.fan_in) * nbytes / bandwidth


class RingAllReduceNetwork(_Network):
    """One collective at a time over a ring of ``workers``: 2(n-1) steps, each moving 1/n of the
    message over every link and paying ``message cost + latency``. A fused message (``core.task.Fused``,
    a DDP bucket) is one collective: its fixed cost once, whatever the pieces in it."""

    accepts_fused = True

    def __init__(self, workers: int, traits: EngineTraits, conditions: Conditions, latency: float,
                 schedule, now) -> None:
        super().__init__(traits, conditions, latency, schedule, now)
        self.workers = workers
        self._free = 0.0

    def _duration(self, nbytes: int, bandwidth: float, messages: int = 1) -> float:
        n = self.workers
        if n == 1:
            return self.overhead * messages
        return 2 * (n - 1) * (self.overhead * messages + self.latency) + 2 * (n - 1) / n * nbytes / bandwidth

    def send(self, task) -> None:
        self.in_flight += 1
        start = max(self._now() + self.traits.startup_latency_s, self._free)
        self._free = start + self._duration(task.nbytes, self.rate(start), self._messages(task))
        self._done_at(self._free, task)

    def sync_time(self, nbytes: int, bandwidth: float) -> float:
        return self._duration(nbytes, bandwidth)

    def comm_time(self, nbytes: int, bandwidth: float) -> float:
        n = self.workers
        return 2 * (n - 1) / n * nbytes / bandwidth if n > 1 else 0.0
