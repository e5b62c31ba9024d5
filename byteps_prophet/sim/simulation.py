"""Discrete-event simulation of synchronous data-parallel training, driving the real core schedulers.

One representative worker (see ``network``) runs forward layer by layer, each layer's forward waiting
only for its own parameters from the previous iteration (layer-wise overlap), then backward, posting
each gradient to the scheduler the moment it is produced. The scheduler object is the same class that
runs in real training; it sees simulated time through its clock and the network through ``send``.

Two ways to measure: the mean steady-state iteration (the default), or ``synchronised``, as the
benchmarks time their steps (``ab``, the framework benches): untimed warm-up iterations, then a
synchronised start (every parameter up to date, nothing in flight), the timed steps, and the end once
every byte of the last one is synchronised. The timed steps' compute is the recorded iterations'
from the first, as they were recorded; their edges (the first forward on an idle link, the last
step's communication with no forward to overlap) count as the benchmarks count them.
"""
from __future__ import annotations

import math
from collections import deque
import random
from dataclasses import dataclass, field
from typing import Callable, Sequence

from byteps_prophet.core import EngineTraits, Settings, Task, make_scheduler
from byteps_prophet.core.link_monitor import LinkMonitor
from byteps_prophet.core.task import Fused
from byteps_prophet.errors import UserError
from byteps_prophet.sim.events import EventLoop
from byteps_prophet.sim.network import (ARCHITECTURES, Conditions, ParameterServerNetwork, RingAllReduceNetwork,
                                       SharedServerNetwork)
from byteps_prophet.sim.replay import SkewHold

DEFAULT_OVERHEAD = 50e-6  # per message per link: the "0.05 ms per message" of the simple model
SYNCHRONISED = -1  # ``Simulation._waiting_for``: every parameter (a synchronised run's first timed step)
MAX_SIMULATED_WORKERS = 64  # workers simulated one by one (``SimulatedCluster.skew``); the representative scales


@dataclass(frozen=True)
class Layer:
    """One parameter tensor and the compute that produces its gradient."""
    name: str
    shape: tuple[int, ...]
    fwd_s: float
    bwd_s: float
    itemsize: int = 4
    recorded: tuple[tuple[float, float], ...] = ()  # (fwd_s, bwd_s) of each recorded iteration

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.elements * self.itemsize

    def times(self, iteration: int) -> tuple[float, float]:
        """(forward, backward) seconds in ``iteration``: the recorded iterations in turn where a profile
        recorded them, else ``fwd_s`` and ``bwd_s`` (the medians, or the cost model's)."""
        if not self.recorded:
            return self.fwd_s, self.bwd_s
        return self.recorded[iteration % len(self.recorded)]


@dataclass(frozen=True)
class SimulatedCluster:
    """The simulated cluster. ``engine`` (calibrated traits, ``core.traits``) describes the engine;
    without one, an ideal engine of ``arch`` whose messages cost ``overhead`` on every link."""
    workers: int = 8
    servers: int | None = None  # None: the engine's, else as many servers as workers
    arch: str = "ps"
    bandwidth: float = 10e9 / 8  # bytes/s per link and direction
    overhead: float = DEFAULT_OVERHEAD
    latency: float = 0.0
    bandwidth_steps: tuple[tuple[float, float], ...] = ()  # (time s, bytes/s)
    compute_steps: tuple[tuple[float, float], ...] = ()  # (time s, compute time factor)
    engine: EngineTraits | None = None
    # Stragglers: each worker's compute per iteration x (1 + jitter x a standard normal draw), one
    # worker x slow_worker more; synchronous training runs at the slowest worker's pace.
    jitter: float = 0.0
    slow_worker: float = 1.0
    seed: int = 0
    # Every worker simulated on its own (a parameter server), worker w starting w x skew seconds after
    # worker 0 (``simulate_every_worker``); None: one representative worker.
    skew: float | None = None
    # Hold every worker at its skew (``SkewHold``): the skew a condition of the run, as a replay takes
    # a recording's; False: the workers start apart and drift as the equal shares take them.
    hold_skew: bool = False

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise UserError(f"architecture {self.arch!r} is unknown; valid: {', '.join(ARCHITECTURES)}")
        if self.engine is not None and (self.arch == "ps") != self.engine.is_parameter_server:
            raise UserError(f"architecture {self.arch!r} does not fit engine {self.engine.name!r} "
                            f"({self.engine.stages} stage(s)); valid: {'ps' if self.engine.stages == 2 else 'allreduce'}")
        if not 0 <= self.jitter < 1:
            raise UserError(f"jitter={self.jitter} is invalid; valid: a number in [0, 1) (0.05 = 5% per worker)")
        if not self.slow_worker >= 1:
            raise UserError(f"slow_worker={self.slow_worker} is invalid; valid: a factor >= 1 (1.5 = 50% slower)")
        if self.workers < 1:
            raise UserError(f"workers={self.workers} is invalid; valid: an integer >= 1")
        if self.servers is not None and self.servers < 1:
            raise UserError(f"servers={self.servers} is invalid; valid: an integer >= 1")
        if self.bandwidth <= 0:
            raise UserError(f"bandwidth={self.bandwidth} is invalid; valid: a positive rate")
        if self.skew is not None:
            if not math.isfinite(self.skew):
                raise UserError(f"skew={self.skew} is invalid; valid: seconds")
            if self.arch != "ps":
                raise UserError(f"skew={self.skew}: every worker is simulated on its own only on a parameter "
                                f"server; valid: architecture 'ps', or no skew")
            if self.workers > MAX_SIMULATED_WORKERS:
                raise UserError(f"skew={self.skew} with workers={self.workers}: every worker simulated on its own "
                                f"takes at most {MAX_SIMULATED_WORKERS}; valid: fewer workers, or no skew")
            if self.hold_skew and self.workers != 2:
                raise UserError(f"hold_skew with workers={self.workers}: a skew is held between two workers (the "
                                f"favour TCP gives one of two, as measured); valid: 2 workers, or no hold_skew")
        elif self.hold_skew:
            raise UserError("hold_skew holds the workers at a skew; valid: a skew with it, or no hold_skew")

    @property
    def traits(self) -> EngineTraits:
        """The engine's traits, with this cluster's number of servers where given."""
        if self.engine is None:
            return EngineTraits(name="ideal", stages=2 if self.arch == "ps" else 1, message_cost_s=self.overhead,
                                servers=self.servers or 0)
        return self.engine if self.servers is None else self.engine.replace(servers=self.servers)


@dataclass
class SpanLog:
    """What happened to each gradient in one traced iteration (for Chrome traces)."""
    iteration: int
    ready: dict[int, float] = field(default_factory=dict)
    pieces: list[tuple[int, str, float, float]] = field(default_factory=list)  # (index, key, start, finish)
    done: dict[int, float] = field(default_factory=dict)
    compute: list[tuple[str, float, float]] = field(default_factory=list)


@dataclass
class SimResult:
    iteration_starts: list[float]
    warmup: int
    sent: list[Task]
    trace: SpanLog | None
    finish_s: float  # when the last byte of the last iteration was synchronised
    messages: list[int] = field(default_factory=list)  # per message the network carried: its iteration
    cycle: int = 1  # the recorded iterations the compute goes through in turn (``Layer.recorded``)
    window: tuple[float, float] | None = None  # synchronised: the timed steps' start and end
    backward_starts: list[float] = field(default_factory=list)  # per iteration, when its backward began
    others: list["SimResult"] = field(default_factory=list)  # every worker simulated on its own: 1, 2, ...

    @property
    def iteration_times(self) -> list[float]:
        s = self.iteration_starts
        return [b - a for a, b in zip(s, s[1:])]

    @property
    def iter_s(self) -> float:
        """Mean steady-state iteration time (after ``warmup`` iterations), over whole cycles of the
        recorded iterations where there are enough (each recorded iteration counts as often); for a
        synchronised run, the timed window over its steps."""
        if self.window is not None:
            start, end = self.window
            return (end - start) / (len(self.iteration_starts) - 1 - self.warmup)
        starts = self.iteration_starts[self.warmup:]
        if len(starts) < 2:
            starts = self.iteration_starts
        span = len(starts) - 1
        if span > self.cycle:
            span -= span % self.cycle
        return (starts[span] - starts[0]) / span

    @property
    def timed_steps_s(self) -> list[float]:
        """A synchronised run's timed steps as the benches' profiles count them (``iteration_s``): from
        each step's backward start to the next one's, the last to the window's end."""
        if self.window is None:
            return []
        marks = self.backward_starts[self.warmup:] + [self.window[1]]
        return [b - a for a, b in zip(marks, marks[1:])]

    @property
    def total_s(self) -> float:
        return self.iteration_starts[-1] - self.iteration_starts[0]


class Simulation:
    def __init__(self, layers: Sequence[Layer], cluster: SimulatedCluster, settings: Settings,
                 iterations: int = 30, warmup: int = 10, trace_iteration: int | None = None,
                 synchronised: bool = False, *, loop: EventLoop | None = None, port=None,
                 worker: int | None = None) -> None:
        """``loop``, ``port`` and ``worker``: one of every worker simulated on its own
        (``simulate_every_worker``), on a shared loop and a ``SharedServerNetwork``'s port."""
        if not layers:
            raise UserError("the model has no parameter tensors")
        self.layers = list(layers)
        self.cluster = cluster
        self.iterations = iterations
        if synchronised and not 0 <= warmup < iterations:
            raise UserError(f"warmup={warmup} leaves no timed step of {iterations} iterations; "
                            f"valid: 0 to {iterations - 1}")
        self.warmup = warmup if synchronised else min(warmup, max(0, iterations - 2))
        # synchronised: the timed steps (from ``warmup`` on) replay the recorded iterations from the first
        self.synchronised = synchronised
        self._compute_offset = self.warmup if synchronised else 0
        self._window_start: float | None = None
        self._last_synced = 0.0
        self.loop = loop or EventLoop()
        self.conditions = Conditions(cluster.bandwidth, cluster.bandwidth_steps, cluster.compute_steps)
        traits = engine_traits(cluster, settings)
        if port is not None:
            self.network = port
        else:
            network = ParameterServerNetwork if traits.is_parameter_server else RingAllReduceNetwork
            self.network = network(cluster.workers, traits, self.conditions, cluster.latency, self.loop.at,
                                   self.loop.now)
        self.worker = worker
        if settings.scheduler == "prophet":  # as the plugins: only Prophet's cuts go out as atoms
            self.network.use_atoms(traits.atom_elements)
        # A real engine's scheduler measures its link as the plugins do (start-up latency apart).
        monitor = LinkMonitor(serializations=traits.stages) if cluster.engine is not None else None
        self.scheduler = make_scheduler(settings, self.loop, self.network, self._on_synced, monitor)
        self.scheduler.on_wakeup = self._wake_at
        self._next_tick = math.inf
        self.network.on_finished = self._on_piece_finished
        self.network.computing = self._computing
        self._sent: list[Task] = []
        self._messages: list[int] = []
        self._trace = SpanLog(trace_iteration) if trace_iteration is not None else None
        self._iteration = 0
        self._synced = [True] * len(self.layers)  # parameter i is up to date for the next forward
        self._waiting_for: int | None = None
        self._iteration_starts: list[float] = []
        self._backward_starts: list[float] = []
        self._rng = random.Random(cluster.seed if worker is None else cluster.seed * 1_000_003 + worker)
        self._pace = 1.0  # the slowest worker's compute factor this iteration
        self.on_iteration_start: Callable = lambda worker, iteration, time: None

    # -- compute ---------------------------------------------------------------------------------------
    def _computing(self) -> bool:
        """Whether the worker computes now: always, but while a forward layer waits for its parameters
        and after the last iteration."""
        return self._waiting_for is None and self._iteration < self.iterations

    def _compute_time(self, seconds: float) -> float:
        factor = self._pace * self.conditions.compute_factor(self.loop.time)
        if self.network.in_flight:  # the engine's threads share the cores
            factor *= self.network.traits.compute_slowdown
        return seconds * factor

    def _slowest_pace(self) -> float:
        """The compute factor of the slowest worker in one iteration (1 without stragglers); simulated
        on its own, this worker's (the slow worker is the last)."""
        cluster = self.cluster
        if self.worker is not None:
            slow = cluster.slow_worker if self.worker == cluster.workers - 1 else 1.0
            return slow * (max(0.1, 1 + cluster.jitter * self._rng.gauss(0.0, 1.0)) if cluster.jitter else 1.0)
        if not cluster.jitter:
            return cluster.slow_worker
        draws = (max(0.1, 1 + cluster.jitter * self._rng.gauss(0.0, 1.0)) for _ in range(cluster.workers))
        first = next(draws) * cluster.slow_worker
        return max(first, max(draws, default=first))

    def _forward(self, i: int) -> None:
        if i == 0 and self._synchronised_start_waits():
            return
        if not self._synced[i]:
            self._waiting_for = i
            return
        if i == 0:
            self._iteration_starts.append(self.loop.time)
            self.on_iteration_start(self.worker, len(self._iteration_starts) - 1, self.loop.time)
            if self._iteration >= self.iterations:
                return  # the start of the iteration after the last ends the measurement
            self._pace = self._slowest_pace()
        start = self.loop.time
        end = start + self._compute_time(self._layer_times(i)[0])
        self._log_compute(f"fwd {i}", start, end)
        if i + 1 < len(self.layers):
            self.loop.at(end, self._forward, i + 1)
        else:
            self.loop.at(end, self._backward, len(self.layers) - 1)

    def _layer_times(self, i: int) -> tuple[float, float]:
        """Layer ``i``'s (forward, backward) seconds this iteration: a synchronised run's timed steps
        replay the recorded iterations from the first."""
        return self.layers[i].times(self._iteration - self._compute_offset)

    def _synchronised_start_waits(self) -> bool:
        """Whether the first timed step must wait for every parameter (a synchronised run); its start
        is the window's."""
        if not self.synchronised or self._iteration != self.warmup or self._window_start is not None:
            return False
        if not all(self._synced):
            self._waiting_for = SYNCHRONISED
            return True
        self._window_start = self.loop.time
        return False

    def _backward(self, i: int) -> None:
        start = self.loop.time
        if i == len(self.layers) - 1:
            self._backward_starts.append(start)
        end = start + self._compute_time(self._layer_times(i)[1])
        self._log_compute(f"bwd {i}", start, end)
        self.loop.at(end, self._gradient_ready, i)

    def _gradient_ready(self, i: int) -> None:
        layer = self.layers[i]
        self._synced[i] = False
        task = Task(layer.name, i, layer.shape, layer.itemsize, iteration=self._iteration)
        if self._trace is not None and self._traced(task):
            self._trace.ready[i] = self.loop.time
        self.scheduler.post(task)
        if i > 0:
            self._backward(i - 1)
        else:
            self.scheduler.end_of_backward(self._iteration)
            self._iteration += 1
            self._forward(0)

    # -- communication ---------------------------------------------------------------------------------
    def _on_piece_finished(self, piece: Task) -> None:
        self._messages.append(piece.iteration)
        for member in piece.members if type(piece) is Fused else (piece,):  # ``sent`` lists the slices
            self._sent.append(member)
            if self._trace is not None and self._traced(member):
                self._trace.pieces.append((member.index, member.key, piece.start_time, self.loop.time))
        self.scheduler.finished(piece)

    def _wake_at(self, t: float) -> None:
        """A timer that keeps only its earliest time, as the plugins' ``WakeupTimer``: a tick asks again
        for whatever the dispatch still needs, so stale ticks never pile up."""
        if t < self._next_tick:
            self._next_tick = t
            self.loop.at(t, self._tick, t)

    def _tick(self, t: float) -> None:
        if t != self._next_tick:
            return  # superseded by an earlier time, which has fired
        self._next_tick = math.inf
        self.scheduler.tick()

    def _on_synced(self, task: Task) -> None:
        if self._trace is not None and self._traced(task):
            self._trace.done[task.index] = self.loop.time
        self._synced[task.index] = True
        self._last_synced = self.loop.time
        if self._waiting_for == SYNCHRONISED and all(self._synced):
            self._waiting_for = None
            self._forward(0)
        elif self._waiting_for == task.index:
            self._waiting_for = None
            self._forward(task.index)

    def _traced(self, task: Task) -> bool:
        return self._trace is not None and task.iteration == self._trace.iteration

    def _log_compute(self, what: str, start: float, end: float) -> None:
        if self._trace is not None and self._iteration == self._trace.iteration:
            self._trace.compute.append((what, start, end))

    # -- run ---------------------------------------------------------------------------------------------
    def run(self) -> SimResult:
        self.start()
        self.loop.run()
        return self.result()

    def start(self, at: float = 0.0) -> None:
        self.loop.at(at, self._forward, 0)

    def result(self) -> SimResult:
        if len(self._iteration_starts) <= self.iterations:
            raise RuntimeError(
                f"simulation stalled in iteration {len(self._iteration_starts)} under {self.scheduler.name}"
            )
        cycle = max(len(layer.recorded) for layer in self.layers) or 1
        window = (self._window_start, self._last_synced) if self.synchronised else None
        return SimResult(self._iteration_starts, self.warmup, self._sent, self._trace, self.loop.time, self._messages,
                         cycle, window, self._backward_starts)


def engine_traits(cluster: SimulatedCluster, settings: Settings) -> EngineTraits:
    """The cluster's engine, with the plugin's atoms where the settings give them
    (``BYTEPS_PROPHET_ATOM_ELEMENTS``)."""
    traits = cluster.traits
    if settings.atom_elements and traits.atom_elements:
        traits = traits.replace(atom_elements=settings.atom_elements)
    return traits


def simulate(layers: Sequence[Layer], cluster: SimulatedCluster, settings: Settings, iterations: int = 30,
             warmup: int = 10, trace_iteration: int | None = None, synchronised: bool = False) -> SimResult:
    """One representative worker (``Simulation``), or every worker on its own where the cluster has a
    ``skew``."""
    if cluster.skew is None:
        return Simulation(layers, cluster, settings, iterations, warmup, trace_iteration, synchronised).run()
    return simulate_every_worker(layers, cluster, settings, iterations, warmup, trace_iteration, synchronised)


def simulate_every_worker(layers: Sequence[Layer], cluster: SimulatedCluster, settings: Settings, iterations: int = 30,
                          warmup: int = 10, trace_iteration: int | None = None,
                          synchronised: bool = False) -> SimResult:
    """Every worker of a parameter server on its own, each with its own compute (the same layers),
    worker w starting ``w x cluster.skew`` after worker 0 (the earliest at 0), sharing the servers'
    links (``SharedServerNetwork``): workers out of step share them unlike one representative (the
    early worker's pulls overlap the late worker's pushes). Worker 0 runs the scheduler; as in the
    plugins (``backends/sync.py``) the others follow it, issuing its slices in its order, each once
    their own gradient is ready (``Follower``); FIFO's workers each run their own, as in the MXNet
    stores (the torch plugin orders FIFO too: the same order where the compute is the same, but a
    worker ahead of worker 0 would wait for it). Worker 0's result, the worker the benchmarks
    report."""
    loop = EventLoop()
    traits = engine_traits(cluster, settings)
    network = SharedServerNetwork(cluster.workers, traits,
                                  Conditions(cluster.bandwidth, cluster.bandwidth_steps, cluster.compute_steps),
                                  cluster.latency, loop.at, loop.now)
    workers = [Simulation(layers, cluster, settings, iterations, warmup, trace_iteration if w == 0 else None,
                          synchronised, loop=loop, port=network.port(w), worker=w) for w in range(cluster.workers)]
    if settings.scheduler != "fifo":  # the plugins' followers issue the leader's slices in its order
        followers = []
        for simulation in workers[1:]:
            simulation.scheduler = Follower(simulation.network, simulation._on_synced)
            followers.append(simulation.scheduler)
        network.port(0).on_send = lambda piece: [follower.announce(piece) for follower in followers]
    offsets = [w * cluster.skew for w in range(cluster.workers)]
    if cluster.hold_skew:
        hold = SkewHold(network, cluster.skew)
        for simulation in workers:
            simulation.on_iteration_start = hold.started
    for simulation, offset in zip(workers, offsets):
        simulation.start(offset - min(offsets))
    loop.run()
    first, *others = [simulation.result() for simulation in workers]
    first.others = others
    return first


class Follower:
    """A follower worker of the plugins' Synchroniser (``backends/sync.py``), in the simulator: it
    issues the leader's slices (``announce``) strictly in the leader's order, each once its own copy
    of that gradient is ready, and reports a gradient synchronised once all its rows are. It takes
    a scheduler's place in its ``Simulation``."""

    name = "follower"

    def __init__(self, transport, on_done: Callable) -> None:
        self.transport, self.on_done = transport, on_done
        self.on_wakeup = None
        self._announced: deque = deque()  # (iteration, index, row_start, row_end) in the leader's order
        self._ready: dict[tuple[int, int], Task] = {}
        self._rows_left: dict[tuple[int, int], int] = {}

    def announce(self, piece: Task) -> None:
        self._announced.append((piece.iteration, piece.index, piece.row_start, piece.row_end))
        self._issue()

    def post(self, task: Task) -> None:
        key = (task.iteration, task.index)
        self._ready[key] = task
        self._rows_left[key] = task.rows
        self._issue()

    def _issue(self) -> None:
        while self._announced:
            iteration, index, row_start, row_end = self._announced[0]
            task = self._ready.get((iteration, index))
            if task is None:
                return  # this worker's gradient is not ready yet: the leader's order waits for it
            self._announced.popleft()
            self.transport.send(task.slice(row_start, row_end))

    def finished(self, piece: Task) -> None:
        key = (piece.iteration, piece.index)
        self._rows_left[key] -= piece.rows
        if self._rows_left[key] == 0:
            del self._rows_left[key]
            self.on_done(self._ready.pop(key))

    def end_of_backward(self, iteration: int) -> None:
        pass

    def tick(self) -> None:
        pass


def lower_bound_s(layers: Sequence[Layer], cluster: SimulatedCluster) -> float:
    """docs/ALGORITHMS.md section 4: max(C, T_comm, C + time to sync gradient 0).

    Section 4 charges the sync of gradient 0's first partition; Prophet's default mode cuts
    partitions, so the bound charges the least time any cut can take (``sync_time``)."""
    sim = Simulation(layers, cluster, Settings())
    compute = sum(layer.fwd_s + layer.bwd_s for layer in layers)
    total_bytes = sum(layer.nbytes for layer in layers)
    bandwidth = cluster.bandwidth
    comm = sim.network.comm_time(total_bytes, bandwidth)
    first = layers[0].nbytes
    return max(compute, comm, compute + sim.network.sync_time(first, bandwidth))


def layers_from(model, times, recorded=()) -> list[Layer]:
    """Simulator layers from a zoo ``ModelSpec`` (or a profile's) and its ``LayerTimes``; ``recorded``:
    ``LayerTimes`` of each recorded iteration, replayed in turn (``recorded.iteration_times``)."""
    return [
        Layer(t.name, tuple(t.shape), fwd, bwd, getattr(t, "itemsize", 4),
              tuple((it.fwd_s[k], it.bwd_s[k]) for it in recorded))
        for k, (t, fwd, bwd) in enumerate(zip(model.tensors, times.fwd_s, times.bwd_s))
    ]
