"""Fitting the simulator to what a real cluster recorded: the patterns the calibration and the replay
measure, run on the simulator's networks.

* :class:`SkewHold` holds two workers at a recorded skew (``simulate --hold-skew``; a replay takes a
  recording's skew as a condition of the run);
* :func:`stream_done_s`: the calibration's back-to-back groups and windowed streams, replayed
  (``calibrate/fit.py`` fits traits against them);
* :func:`bursts_done_s`: workers bursting ops onto a parameter server's shared links, as the skew
  investigations measured them (``docs/ENGINE.md``, "Workers out of step"; the scripts that measured
  them were last at commit 8a65c96).
"""
from __future__ import annotations

import math
from typing import Sequence

from byteps_prophet.core import EngineTraits, Task
from byteps_prophet.sim.events import EventLoop
from byteps_prophet.sim.network import Conditions, ParameterServerNetwork, RingAllReduceNetwork, SharedServerNetwork


class SkewHold:
    """Holds worker 1 of a two-worker ``SharedServerNetwork`` ``skew`` seconds behind worker 0: once
    both started an iteration, worker 1's weight on the servers' ingress (``favour``) is
    exp(PROPORTIONAL x its lateness beyond the skew + INTEGRAL x that lateness summed over the
    iterations so far), lateness counted in iterations (of worker 0's last), within [1/LIMIT, LIMIT].
    The summed term holds a steady drift; the proportional one damps the swings the summed one alone
    sets off.

    Which worker's connection TCP favours, and how much, decides whether two workers drift apart or
    stay in step; it differs from cluster to cluster and burst to burst, and equal shares, which the
    simulator otherwise gives, drift every pair apart. A replay takes the recorded skew as the trace
    of that favour, and this gives the favour that keeps it (``docs/ENGINE.md``, "The current
    replay"). LIMIT 2 caps the late worker's share at two thirds, the favour seen between two workers
    (which is why ``SimulatedCluster`` allows a held skew for two only)."""

    PROPORTIONAL = 3.0  # log-weight per iteration of lateness now
    INTEGRAL = 1.0  # log-weight per iteration of lateness summed over the iterations so far
    LIMIT = 2.0

    def __init__(self, network, skew: float) -> None:
        self.network, self.skew = network, skew
        self._starts: dict[int, dict[int, float]] = {}  # iteration -> worker -> its start, until both started
        self._leader_start: float | None = None
        self._summed = 0.0  # worker 1's lateness so far, in iterations

    def started(self, worker: int, iteration: int, time: float) -> None:
        starts = self._starts.setdefault(iteration, {})
        starts[worker] = time
        if len(starts) < 2:
            return
        del self._starts[iteration]
        previous, self._leader_start = self._leader_start, starts[0]
        if previous is None or starts[0] <= previous:
            return  # no iteration's time yet to measure lateness in
        lateness = (starts[1] - starts[0] - self.skew) / (starts[0] - previous)
        bound = math.log(self.LIMIT) / self.INTEGRAL  # the sum winds up no further than the limit
        self._summed = min(bound, max(-bound, self._summed + lateness))
        weight = math.exp(self.PROPORTIONAL * lateness + self.INTEGRAL * self._summed)
        self.network.favour(1, min(self.LIMIT, max(1 / self.LIMIT, weight)))


def stream_done_s(traits: EngineTraits, bandwidth: float, workers: int, tensor_bytes: int, ops: int,
                  window: int) -> list[float]:
    """When the simulator's network completes each of ``ops`` ops of ``tensor_bytes``, sent from time 0
    with at most ``window`` in flight (the next as one completes; ``window=ops``: all at once): the
    calibration's back-to-back groups and windowed streams, replayed (``calibrate/fit.py``)."""
    loop = EventLoop()
    kind = ParameterServerNetwork if traits.is_parameter_server else RingAllReduceNetwork
    network = kind(workers, traits, Conditions(bandwidth), 0.0, loop.at, loop.now)
    tasks = [Task(f"op{i}", i, (max(1, tensor_bytes // 4),)) for i in range(ops)]
    done: list[float] = []

    def finished(_task) -> None:
        done.append(loop.time)
        following = len(done) + window - 1
        if following < ops:
            network.send(tasks[following])

    network.on_finished = finished
    loop.at(0.0, lambda _: [network.send(task) for task in tasks[:window]])
    loop.run()
    return done


def bursts_done_s(traits: EngineTraits, bandwidth: float, workers: int, tensor_bytes: int, ops: int, bursts: int,
                  starts: Sequence[float] | None = None,
                  gaps_s: Sequence[float] | None = None,
                  compute_s: float = 0.0) -> list[list[tuple[float, list[float]]]]:
    """When each worker of a parameter server, every one on its own port of the servers' shared links
    (``SharedServerNetwork``), completes each of ``ops`` ops of ``tensor_bytes`` it sends at once, at
    its time in ``starts`` (default: all at 0, in step), op i ``i x`` its gap in ``gaps_s`` after its
    burst's start (default: all at once), ``bursts`` times back to back (its next burst ``compute_s``
    after the last answer of the one before, the worker computing meanwhile), as the skew
    investigations measured them (module docstring). Per worker, per burst: when it was sent and when each op
    completed (the same op of every worker answered once all pushed it in that burst)."""
    loop = EventLoop()
    network = SharedServerNetwork(workers, traits, Conditions(bandwidth), 0.0, loop.at, loop.now)
    runs: list[list[tuple[float, list[float]]]] = [[] for _ in range(workers)]

    def send(worker: int) -> None:
        burst = len(runs[worker])
        runs[worker].append((loop.time, []))
        for i in range(ops):
            task = Task(f"op{i}", i, (max(1, tensor_bytes // 4),), iteration=burst)
            if gaps_s and gaps_s[worker]:
                loop.at(loop.time + i * gaps_s[worker], lambda _, task=task: network.port(worker).send(task))
            else:
                network.port(worker).send(task)

    def computed(worker: int) -> None:
        network.port(worker).computing = lambda: False
        send(worker)

    def finished(worker: int) -> None:
        done = runs[worker][-1][1]
        done.append(loop.time)
        if len(done) == ops and len(runs[worker]) < bursts:
            if compute_s:
                network.port(worker).computing = lambda: True
                loop.at(loop.time + compute_s, lambda _, w=worker: computed(w))
            else:
                send(worker)

    for w in range(workers):
        network.port(w).on_finished = lambda _task, w=w: finished(w)
        loop.at(starts[w] if starts else 0.0, lambda _, w=w: send(w))
    loop.run()
    return runs
