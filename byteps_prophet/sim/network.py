"""Network cost models of one representative worker, driven by the engine's traits.

Every worker runs the same schedule, so simulating one worker and charging the shared resources
(server links, the ring) for all of them is exact for a homogeneous cluster and keeps the simulator
fast at any scale (stragglers: the engine's compute model, ``sim/simulation.py``). Links are FIFO; each
message pays the engine's ``message_cost_s`` on every link it occupies (once per atom where the plugin
sends Prophet's fixed atoms, ``use_atoms``) plus its bytes over the link's bandwidth, and one-way ``latency`` (propagation, not
occupying the link). An op reaches the link only ``startup_latency_s`` after it is sent; ops already
queued overlap that wait. With bandwidth on a schedule, a message is charged at the bandwidth in force
when it starts on a link, over the engine's ``comm_slowdown`` if the worker computes when it is sent.
"""
from __future__ import annotations

import math
from typing import Callable

from byteps_prophet.core.traits import EngineTraits

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


class SharedServerNetwork:
    """Every worker of a parameter-server cluster, each with its own port (``port(w)``, what its
    scheduler sends on), sharing the servers' links: for workers out of step, where one
    representative worker cannot say whose bytes meet on a server link (``ParameterServerNetwork``
    assumes every worker sends the same bytes at the same time).

    Each worker's connection carries its messages in order (pushes, and the pull requests behind
    them where pulls follow pushes), the one at its head a flow on the servers' ingress. With
    ``backpressure`` a request waits there until the servers have every push before it; without, it
    leaves once the worker's own link (at a worker link's rate) is through with them. The
    servers answer a pull once every worker has pushed those rows in that iteration, and each
    worker's answers come back in order, the head one a flow on their egress. A server link's
    direction is shared by its flows (processor sharing, as TCP shares a link between connections):
    each moves at min(1, servers / flows) of a worker link's rate (on the ingress in proportion to
    its connection's weight, 1 unless ``favour`` gives another), at ``duplex_efficiency`` of that
    while the other direction carries a flow too. A message's work on each link is the engine's
    ``message_cost_s`` plus its bytes at the rate in force when it is sent (over ``comm_slowdown``
    while its worker computes)."""

    def __init__(self, workers: int, traits: EngineTraits, conditions: Conditions, latency: float,
                 schedule, now) -> None:
        if not traits.is_parameter_server:
            raise ValueError("a shared server network is a parameter server's")
        self.traits, self.conditions, self.latency = traits, conditions, latency
        self.schedule, self.now = schedule, now
        self.capacity = float(traits.servers or workers)  # worker links' worth of rate per direction
        self.ports = [_Port(self, w) for w in range(workers)]
        # per worker, messages in order as [kind, task, work left]: into the servers, out of them
        self._in = [[] for _ in range(workers)]
        self._out = [[] for _ in range(workers)]
        self._link_free = [0.0] * workers  # without back-pressure: when the worker's own link is through
        self.ingress_weights = [1.0] * workers  # each connection's weight on the ingress (``favour``)
        self._pushed: dict[tuple[int, int], list[list[tuple[int, int]]]] = {}  # (iteration, index) -> per worker rows
        self._waiting: dict[tuple[int, int], list[tuple[int, object]]] = {}  # pulls not yet answerable
        self._updated = 0.0
        self._generation = 0

    def port(self, worker: int) -> "_Port":
        return self.ports[worker]

    # -- messages ------------------------------------------------------------------------------------
    def send(self, port: "_Port", task) -> None:
        """``port``'s worker sends ``task``: it reaches the link the engine's start-up latency later."""
        self.schedule(self.now() + self.traits.startup_latency_s, self._push, (port, task))

    def _work(self, port: "_Port", task) -> float:
        """Seconds at a worker link's full rate ``task`` takes on a link: per message, the engine's
        cost, and its bytes at the port's rate now (``_Network.rate``: over ``comm_slowdown`` while the
        worker computes)."""
        return self.traits.message_cost_s * port._messages(task) + task.nbytes / port.rate(self.now())

    def _push(self, item) -> None:
        port, task = item
        self._advance()
        work = self._work(port, task)
        self._in[port.worker].append(["push", task, work])
        self._link_free[port.worker] = max(self.now(), self._link_free[port.worker]) + work
        self._reschedule()

    def _pushed_rows(self, worker: int, task) -> None:
        per_worker = self._pushed.setdefault((task.iteration, task.index), [[] for _ in self.ports])
        per_worker[worker].append((task.row_start, task.row_end))
        for waiting in list(self._waiting.get((task.iteration, task.index), ())):
            self._answer_if_pushed(*waiting)

    def _covered(self, worker: int, task) -> bool:
        rows = sorted(self._pushed.get((task.iteration, task.index), [[]] * len(self.ports))[worker])
        reach = task.row_start
        for start, end in rows:
            if start > reach:
                break
            reach = max(reach, end)
        return reach >= task.row_end

    def _request(self, worker: int, task) -> None:
        """Worker ``worker`` asks for ``task``'s rows: answered once every worker has pushed them."""
        key = (task.iteration, task.index)
        self._waiting.setdefault(key, []).append((worker, task))
        self._answer_if_pushed(worker, task)

    def _answer_if_pushed(self, worker: int, task) -> None:
        if not all(self._covered(w, task) for w in range(len(self.ports))):
            return
        key = (task.iteration, task.index)
        self._waiting[key].remove((worker, task))
        if not self._waiting[key]:
            del self._waiting[key]
        self._out[worker].append(["pull", task, self._work(self.ports[worker], task)])

    # -- the fluid links -----------------------------------------------------------------------------
    def favour(self, worker: int, weight: float) -> None:
        """Give ``worker``'s connection ``weight`` against the others' 1 on the servers' ingress: TCP
        favours one worker's connection over another's (docs/ENGINE.md, "Two workers bursting
        together"), which equal shares do not model; ``SkewHold`` sets it."""
        self._advance()
        self.ingress_weights[worker] = weight
        self._reschedule()

    def _rates(self) -> tuple[list[float], list[float]]:
        """Each worker's head flow's share of a worker link's rate on the ingress and on the egress
        (0 where it has none): the ingress water-filled by the workers' weights, each at most 1."""
        up = [w for w, q in enumerate(self._in) if q]
        down = sum(1 for q in self._out if q)
        e = self.traits.duplex_efficiency
        ingress = _water_fill(self.capacity, {w: self.ingress_weights[w] for w in up}, len(self._in))
        ins = [rate * (e if down else 1.0) for rate in ingress]
        share = min(1.0, self.capacity / down) * (e if up else 1.0) if down else 0.0
        return ins, [share if q else 0.0 for q in self._out]

    def _groups(self):
        return zip((self._in, self._out), self._rates())

    def _advance(self) -> None:
        now = self.now()
        elapsed = now - self._updated
        self._updated = now
        if elapsed <= 0:
            return
        for queues, rates in self._groups():
            for q, rate in zip(queues, rates):
                if q:
                    q[0][2] -= elapsed * rate

    def _reschedule(self) -> None:
        """Finish what is done, then wake at the next head's completion."""
        while True:
            done = [(w, q) for queues in (self._in, self._out) for w, q in enumerate(queues)
                    if q and q[0][2] <= 1e-12]
            if not done:
                break
            for w, q in done:
                self._complete(w, q.pop(0))
        soonest = math.inf
        for queues, rates in self._groups():
            for q, rate in zip(queues, rates):
                if q and rate > 0:
                    soonest = min(soonest, q[0][2] / rate)
        self._generation += 1
        if soonest < math.inf:
            self.schedule(self.now() + soonest, self._wake, self._generation)

    def _wake(self, generation: int) -> None:
        if generation != self._generation:
            return  # superseded: the flows changed since
        self._advance()
        self._reschedule()

    def _complete(self, worker: int, item: list) -> None:
        kind, task, _ = item
        if kind == "push":
            self._pushed_rows(worker, task)
            cost = self.traits.message_cost_s
            if not self.traits.pulls_follow_pushes or self.traits.pull_in_reply:
                self._request(worker, task)
            elif self.traits.backpressure:  # behind every push queued on the connection by now
                self._in[worker].append(["request", task, cost])
            else:  # once the worker's own link is through with what was sent before
                self._link_free[worker] = leaves = max(self.now(), self._link_free[worker]) + cost
                self.schedule(leaves + self.latency, self._requested, (worker, task))
        elif kind == "request":
            self._request(worker, task)
        else:
            self.schedule(self.now() + self.latency, self.ports[worker]._finished, task)

    def _requested(self, item) -> None:
        self._advance()
        self._request(*item)
        self._reschedule()


def _water_fill(capacity: float, weights: dict[int, float], size: int) -> list[float]:
    """Shares of ``capacity`` (worker links' worth) among the flows of ``weights`` (worker -> weight),
    in proportion to their weights, none above 1 (its own link's rate); the rest to the others."""
    rates = [0.0] * size
    left = dict(weights)
    while left:
        total = sum(left.values())
        capped = [w for w, weight in left.items() if capacity * weight / total > 1.0]
        if not capped:
            for w, weight in left.items():
                rates[w] = capacity * weight / total
            break
        for w in capped:
            rates[w] = 1.0
            capacity -= 1.0
            del left[w]
    return rates


class _Port(_Network):
    """One worker's view of a ``SharedServerNetwork``: what its scheduler sends on and its simulation
    reads (``in_flight``, ``computing``, ``on_finished``, atoms), as a ``ParameterServerNetwork``."""

    def __init__(self, network: SharedServerNetwork, worker: int) -> None:
        super().__init__(network.traits, network.conditions, network.latency, network.schedule, network.now)
        self.network, self.worker = network, worker
        self.on_send: Callable = lambda task: None  # the leader's announcement of what it sends

    def send(self, task) -> None:
        self.in_flight += 1
        self.on_send(task)
        self.network.send(self, task)
