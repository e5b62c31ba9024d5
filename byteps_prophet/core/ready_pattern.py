"""The stepwise ready pattern of one iteration, profiled robustly over several iterations.

Every gradient's ready time is recorded as an offset from the iteration's first ready gradient.
A profile is the per-gradient median offset over ``iterations`` iterations. Sorting gradients by
offset (backward order), a gap between neighbours larger than ``boundary_factor`` x the mean gap is a
step boundary; boundaries cut the gradients into blocks B_0, B_1, ... and ``gap_after`` of a block is
the idle computation time before the next block starts.

Recording never stops: an iteration whose span (first to last ready) differs from the profile's by
more than ``drift_tolerance``, or that brings gradients the profile lacks, counts as drifted (missing
gradients do not: unused parameters come and go), and ``iterations`` drifted iterations in a row are
re-profiled from themselves.
"""
from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Block:
    indices: tuple[int, ...]  # backward order
    start: float  # median offset of the block's first gradient
    end: float  # median offset of its last gradient
    gap_after: float | None  # idle time until the next block starts; None for the last block


@dataclass(frozen=True)
class StepProfile:
    offsets: dict[int, float]
    blocks: tuple[Block, ...]
    block_of: dict[int, int]

    @property
    def span(self) -> float:
        return self.blocks[-1].end - self.blocks[0].start

    def block_for(self, index: int) -> int:
        """The block of a gradient; one the profile never saw joins the block of its nearest neighbour."""
        if index in self.block_of:
            return self.block_of[index]
        nearest = min(self.block_of, key=lambda known: (abs(known - index), known))
        return self.block_of[nearest]


def find_blocks(offsets: dict[int, float], boundary_factor: float) -> tuple[Block, ...]:
    order = sorted(offsets, key=lambda i: (offsets[i], -i))
    times = [offsets[i] for i in order]
    gaps = [b - a for a, b in zip(times, times[1:])]
    mean_gap = sum(gaps) / len(gaps) if gaps else 0.0
    cuts = [j + 1 for j, gap in enumerate(gaps) if mean_gap > 0 and gap > boundary_factor * mean_gap]
    bounds = [0, *cuts, len(order)]
    blocks = []
    for k, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        gap_after = times[hi] - times[hi - 1] if hi < len(order) else None
        blocks.append(Block(tuple(order[lo:hi]), times[lo], times[hi - 1], gap_after))
    return tuple(blocks)


class ReadyProfiler:
    def __init__(self, iterations: int = 3, boundary_factor: float = 2.0, drift_tolerance: float = 0.25) -> None:
        self.iterations = iterations
        self.boundary_factor = boundary_factor
        self.drift_tolerance = drift_tolerance
        self.profile: StepProfile | None = None
        self.profiles_built = 0
        self._recent: deque[dict[int, float]] = deque(maxlen=iterations)
        self._drifted_in_a_row = 0
        self._iteration: int | None = None
        self._first_ready = 0.0
        self._offsets: dict[int, float] = {}

    def record(self, iteration: int, index: int, t: float) -> None:
        if iteration != self._iteration:
            self.close()
            self._iteration, self._first_ready = iteration, t
        self._offsets.setdefault(index, t - self._first_ready)

    def close(self) -> None:
        """End the current iteration (at the end of backward, or when the next one starts)."""
        if not self._offsets:
            return
        offsets, self._offsets = self._offsets, {}
        self._recent.append(offsets)
        if self.profile is None:
            if len(self._recent) >= self.iterations:
                self._build()
            return
        self._drifted_in_a_row = self._drifted_in_a_row + 1 if self._drifted(offsets) else 0
        if self._drifted_in_a_row >= self.iterations:
            self._build()

    def renumber(self, index_of: dict[int, int]) -> None:
        """The same gradients under new indices (``Scheduler.renumber``), between iterations: the recent
        iterations are renumbered and the profile built from them again."""
        self.close()
        self._recent = deque(({index_of.get(i, i): t for i, t in offsets.items()} for offsets in self._recent),
                             maxlen=self.iterations)
        if self.profile is not None:
            self._build()

    def _drifted(self, offsets: dict[int, float]) -> bool:
        profile = self.profile
        if not set(offsets) <= set(profile.offsets):  # new gradients; missing ones are tolerated
            return True
        span = max(offsets.values()) - min(offsets.values())
        return abs(span - profile.span) > self.drift_tolerance * max(profile.span, 1e-9)

    def _build(self) -> None:
        indices = set().union(*self._recent)
        medians = {i: statistics.median(it[i] for it in self._recent if i in it) for i in indices}
        blocks = find_blocks(medians, self.boundary_factor)
        block_of = {i: k for k, block in enumerate(blocks) for i in block.indices}
        self.profile = StepProfile(medians, blocks, block_of)
        self.profiles_built += 1
        self._drifted_in_a_row = 0
