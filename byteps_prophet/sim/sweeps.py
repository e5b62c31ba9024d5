"""A baseline's best over its own knobs: a grid of knob values, widened while the best sits at its edge.

A best value on the edge of a fixed grid says only that the baseline may do better outside it. Every
sweep starts from its grid and, while the best point sits at an edge of one knob's axis, adds the next
value past that edge (twice the highest, half the lowest), at most ``WIDENINGS`` values on each side, and
never past the knob's natural limit: the value past which it changes nothing (one bucket holding the
whole model, a partition no smaller than the largest tensor, a fusion threshold of 0). A best still on
an edge the sweep could have passed is an *open edge*, reported with the result; a best on a natural
limit is the knob's real optimum.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

WIDENINGS = 3  # values added past each edge of an axis at most


@dataclass(frozen=True)
class Axis:
    """One knob: its starting values (ascending) and its natural limits."""
    name: str
    values: tuple
    lowest: float = 0
    highest: float = math.inf

    def beyond(self, value, upward: bool):
        """The next value past ``value`` on one side, or None where ``value`` is the natural limit."""
        if upward:
            if value >= self.highest or value <= 0:
                return None
            return type(value)(min(value * 2, self.highest))
        if value <= self.lowest:
            return None
        return max(type(value)(value / 2), type(value)(self.lowest))


class Sweep(NamedTuple):
    best: tuple  # one value per axis
    times: dict[tuple, float]  # every point tried -> its iteration seconds
    open_edges: tuple[str, ...]  # axes whose best sits on an edge the widening could not pass


def widened_sweep(time_of: Callable[..., float], axes: Sequence[Axis], widenings: int = WIDENINGS) -> Sweep:
    """The point of ``axes``' grid with the shortest ``time_of(*point)``, the grid widened as the module
    says; every point is timed once."""
    grid = [list(axis.values) for axis in axes]
    added = {(i, upward): 0 for i in range(len(axes)) for upward in (False, True)}
    times: dict[tuple, float] = {}
    while True:
        for point in itertools.product(*grid):
            if point not in times:
                times[point] = time_of(*point)
        best = min(times, key=times.get)
        grown, open_edges = False, []
        for i, axis in enumerate(axes):
            for upward, edge in ((False, grid[i][0]), (True, grid[i][-1])):
                nxt = axis.beyond(edge, upward) if best[i] == edge else None
                if nxt is None or nxt in grid[i]:
                    continue
                if added[i, upward] >= widenings:
                    open_edges.append(axis.name)
                    continue
                grid[i].insert(len(grid[i]) if upward else 0, nxt)
                added[i, upward] += 1
                grown = True
        if not grown:
            return Sweep(best, times, tuple(dict.fromkeys(open_edges)))
