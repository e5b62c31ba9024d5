"""Communication tasks with ByteScheduler's lifecycle: posted -> ready -> started -> finished.

A ``Task`` is one gradient of one iteration, or a slice of one along dim 0 (its rows). Slices are
children of the whole-gradient task; the whole task finishes when every row has been synchronised
exactly once. The framework tensor rides along as an opaque ``payload`` the core never touches.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

PRIORITY_STRIDE = 1000  # priority = index * 1000 + partition number, as in ByteScheduler


class State(enum.Enum):
    POSTED = "posted"
    READY = "ready"
    STARTED = "started"
    FINISHED = "finished"


@dataclass(eq=False)
class Task:
    name: str
    index: int  # forward order of the parameter: 0 is needed first by the next forward pass
    shape: tuple[int, ...]
    itemsize: int = 4
    iteration: int = 0
    payload: Any = None
    row_start: int = 0
    row_end: int = -1  # -1: all rows
    part: int = 0  # partition number within the gradient (second half of the priority)
    parent: "Task | None" = None
    state: State = State.POSTED
    # Set on the whole-gradient task: rows finished so far, and when it became ready / finished.
    rows_done: int = 0
    ready_time: float = math.nan
    start_time: float = math.nan
    finish_time: float = math.nan

    def __post_init__(self) -> None:
        self.shape = tuple(int(d) for d in self.shape) or (1,)
        if self.row_end < 0:
            self.row_end = self.shape[0]
        if not 0 <= self.row_start < self.row_end <= self.shape[0]:
            raise ValueError(f"{self.name}: rows [{self.row_start}, {self.row_end}) outside 0..{self.shape[0]}")

    # -- sizes ------------------------------------------------------------------------------------
    @property
    def rows(self) -> int:
        return self.row_end - self.row_start

    @property
    def row_numel(self) -> int:
        return math.prod(self.shape[1:])

    @property
    def numel(self) -> int:
        return self.rows * self.row_numel

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def priority(self) -> int:
        return self.index * PRIORITY_STRIDE + self.part

    @property
    def root(self) -> "Task":
        return self.parent.root if self.parent is not None else self

    @property
    def is_whole(self) -> bool:
        return self.parent is None

    @property
    def key(self) -> str:
        """A stable name for this slice: the same rows of the same gradient get the same key."""
        if self.rows == self.shape[0]:
            return self.name
        return f"{self.name}[{self.row_start}:{self.row_end}]"

    # -- slicing ------------------------------------------------------------------------------------
    def slice(self, row_start: int, row_end: int, part: int | None = None) -> "Task":
        """A child covering rows [row_start, row_end) of this task's gradient."""
        root = self.root
        child = Task(
            name=root.name, index=root.index, shape=root.shape, itemsize=root.itemsize,
            iteration=root.iteration, payload=root.payload, row_start=row_start, row_end=row_end,
            part=self.part if part is None else part, parent=root, state=State.READY,
        )
        return child

    def partition(self, max_numel: int) -> list["Task"]:
        """ByteScheduler's rule: ceil(numel / max_numel) pieces along dim 0, never more than rows;
        rows spread evenly with the last ``rows % n`` pieces one row longer."""
        if self.numel <= max_numel:
            return [self.slice(self.row_start, self.row_end, part=0)]
        count = min(math.ceil(self.numel / max_numel), self.rows)
        base, extra = divmod(self.rows, count)
        pieces, start = [], self.row_start
        for i in range(count):
            length = base + (1 if i >= count - extra else 0)
            pieces.append(self.slice(start, start + length, part=i))
            start += length
        return pieces

    def __repr__(self) -> str:
        return f"Task({self.key}, it={self.iteration}, prio={self.priority}, {self.nbytes}B, {self.state.value})"
