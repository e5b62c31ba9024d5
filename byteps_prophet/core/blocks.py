"""The profiled blocks through one iteration (docs/ALGORITHMS.md section 3): which blocks are
collected (every gradient arrived, or a later block started), and the collected blocks whose budget
(their gap after, times the bandwidth) the paper mode has yet to grant.
"""
from __future__ import annotations

from collections import deque

from byteps_prophet.core.ready_pattern import StepProfile


class BlockProgress:
    def __init__(self) -> None:
        self.sizes: list[int] = []  # each block's gradient count, from the profile
        self.missing: list[int] = []  # each block's gradients not yet arrived this iteration
        self.next = 0  # the first block not yet collected
        self.in_last = False  # the last block is collected: the paper mode sends under the credit
        self.releases: deque[int] = deque()  # collected blocks whose budget is still to grant

    def derive(self, plan: StepProfile) -> None:
        self.sizes = [len(block.indices) for block in plan.blocks]

    def begin(self) -> None:
        """A new iteration: nothing arrived, nothing collected."""
        self.missing = list(self.sizes)
        self.next = 0
        self.in_last = False
        self.releases.clear()

    def arrived(self, block: int) -> None:
        self.missing[block] -= 1

    def collect(self, plan: StepProfile, until: int) -> None:
        """Blocks before ``until`` are complete (a later one has started); so is any fully arrived."""
        blocks, missing = plan.blocks, self.missing
        while self.next < len(blocks):
            block = blocks[self.next]
            if self.next >= until and missing[self.next] > 0:
                return
            if block.gap_after is None:
                self.in_last = True
            else:
                self.releases.append(self.next)
            self.next += 1
        self.in_last = True
