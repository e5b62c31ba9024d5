"""The simulator's clock: a discrete-event loop that runs callbacks in time order (ties in the order
they were scheduled)."""
from __future__ import annotations

import heapq
import itertools
from typing import Callable


class EventLoop:
    """Time and the events to come; ``now`` and ``at`` are what the schedulers and networks are given."""

    def __init__(self) -> None:
        self._heap: list = []
        self._seq = itertools.count()
        self.time = 0.0

    def now(self) -> float:
        return self.time

    def at(self, when: float, callback: Callable, arg=None) -> None:
        heapq.heappush(self._heap, (when, next(self._seq), callback, arg))

    def run(self) -> None:
        heap = self._heap
        while heap:
            self.time, _, callback, arg = heapq.heappop(heap)
            callback(arg)

