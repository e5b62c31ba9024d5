"""Communication tasks with ByteScheduler's lifecycle: posted -> ready -> started -> finished.

A ``Task`` is one gradient of one iteration, or a slice of one along dim 0 (its rows). Slices are
children of the whole-gradient task; the whole task finishes when every row has been synchronised
exactly once. The framework tensor rides along as an opaque ``payload`` the core never touches.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any


class TensorSize:
    """``numel`` and ``nbytes`` of a tensor description with ``shape`` and ``itemsize``."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

PRIORITY_STRIDE = 1000  # priority = index * 1000 + partition number, as in ByteScheduler
_new_task = object.__new__


def atom_rows(row_numel: int, elements: int) -> int:
    """Rows per fixed atom of about ``elements`` elements. Engines where every distinct slice is a key
    to set up (the BytePS backend, the MXNet store) send each gradient as a grid of such atoms from row
    0, and Prophet cuts on the same grid (``Prophet.cut_elements``)."""
    return max(1, elements // max(1, row_numel))


def atom_grid(rows: int, row_numel: int, elements: int) -> list[tuple[int, int]]:
    """The row ranges of those atoms for a gradient of ``rows`` rows: runs of ``atom_rows`` from 0."""
    step = atom_rows(row_numel, elements)
    return [(a, min(a + step, rows)) for a in range(0, rows, step)]


class State(enum.Enum):
    POSTED = "posted"
    READY = "ready"
    STARTED = "started"
    FINISHED = "finished"


@dataclass(eq=False, slots=True)
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
    # Derived at construction (and by ``split_head``; nothing else changes rows, shape or index):
    # schedulers read them on every event, so they are plain attributes, not recomputed properties.
    rows: int = field(init=False, repr=False)
    row_numel: int = field(init=False, repr=False)
    numel: int = field(init=False, repr=False)
    nbytes: int = field(init=False, repr=False)
    priority: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.shape = tuple(map(int, self.shape)) or (1,)
        if self.row_end < 0:
            self.row_end = self.shape[0]
        if not 0 <= self.row_start < self.row_end <= self.shape[0]:
            raise ValueError(f"{self.name}: rows [{self.row_start}, {self.row_end}) outside 0..{self.shape[0]}")
        self.row_numel = math.prod(self.shape[1:])
        self._size()

    def _size(self) -> None:
        self.rows = rows = self.row_end - self.row_start
        self.numel = numel = rows * self.row_numel
        self.nbytes = numel * self.itemsize
        self.priority = self.index * PRIORITY_STRIDE + self.part

    def split_head(self, rows: int) -> "Task":
        """Cut the first ``rows`` off an unsent slice: they come back as a new slice (same partition
        number), and this slice keeps the rest (a scheduler cutting a queued piece)."""
        parent = self.parent
        if parent is None or self.state is not State.READY or not 0 < rows < self.rows:
            raise ValueError(f"cannot split {rows} rows off {self!r}")
        root = parent.root
        head = _new_task(Task)
        head.name, head.index, head.shape, head.itemsize, head.iteration, head.payload = \
            self.name, self.index, self.shape, self.itemsize, self.iteration, self.payload
        start = self.row_start
        head.row_start, head.row_end, head.part, head.parent, head.state, head.rows_done = \
            start, start + rows, self.part, root, State.READY, 0
        head.ready_time = head.start_time = head.finish_time = math.nan
        head.row_numel = row_numel = self.row_numel
        head.rows = rows
        head.numel = numel = rows * row_numel
        head.nbytes = numel * self.itemsize
        head.priority = self.priority
        self.row_start = start + rows
        self._size()
        return head

    # -- sizes ------------------------------------------------------------------------------------
    @property
    def root(self) -> "Task":
        parent = self.parent
        return self if parent is None else parent.root

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
        parent = self.parent
        root = self if parent is None else parent.root
        if not 0 <= row_start < row_end <= root.shape[0]:
            raise ValueError(f"{root.name}: rows [{row_start}, {row_end}) outside 0..{root.shape[0]}")
        # The fields a constructor would set, without re-validating the root's shape per slice.
        child = _new_task(Task)
        child.name, child.index, child.shape, child.itemsize, child.iteration, child.payload = \
            root.name, root.index, root.shape, root.itemsize, root.iteration, root.payload
        child.row_start, child.row_end, child.part, child.parent, child.state, child.rows_done = \
            row_start, row_end, self.part if part is None else part, root, State.READY, 0
        child.ready_time = child.start_time = child.finish_time = math.nan
        child.row_numel = row_numel = root.row_numel
        child.rows = rows = row_end - row_start
        child.numel = numel = rows * row_numel
        child.nbytes = numel * root.itemsize
        child.priority = root.index * PRIORITY_STRIDE + child.part
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

    def atom_runs(self, max_numel: int, atom_elements: int) -> list["Task"]:
        """``partition`` for an engine with fixed atoms: runs of whole atoms of about ``max_numel``
        elements, so that a piece never ends inside an atom (the engine would send the whole atom with
        the first piece)."""
        quantum = atom_rows(self.row_numel, atom_elements)
        run = quantum * max(1, round(max_numel / (quantum * self.row_numel)))
        return [self.slice(self.row_start + a, self.row_start + b, part=part)
                for part, (a, b) in enumerate(atom_grid(self.rows, self.row_numel, run * self.row_numel))]

    def rows_for(self, nbytes: float, atom_elements: int = 0) -> int:
        """Rows to cut from the start of this slice for about ``nbytes``: at least one; with
        ``atom_elements`` the cut ends on the next atom boundary (counted from row 0 of the gradient),
        so every slice is a run of the same fixed atoms whatever the cut."""
        rows = max(1, int(nbytes // (self.row_numel * self.itemsize)))
        if atom_elements:
            quantum = atom_rows(self.row_numel, atom_elements)
            end = -(-(self.row_start + rows) // quantum) * quantum
            rows = end - self.row_start
        return rows

    def __repr__(self) -> str:
        return f"Task({self.key}, it={self.iteration}, prio={self.priority}, {self.nbytes}B, {self.state.value})"


class Fused:
    """Several queued pieces sent as one message: on an all-reduce engine one collective of their
    concatenated rows (docs/DESIGN.md, "Fused collectives"). The scheduler starts and finishes each
    member through it, so every member's rows are still synchronised exactly once; the transport and
    the link's monitor see one message of ``nbytes``."""

    __slots__ = ("members", "nbytes", "numel", "rows", "index", "iteration", "priority", "key", "state",
                 "start_time", "finish_time")
    parent = None

    def __init__(self, members: list[Task]) -> None:
        if not members:
            raise ValueError("a fused message of no pieces")
        self.members = members
        self.nbytes = sum(piece.nbytes for piece in members)
        self.numel = sum(piece.numel for piece in members)
        self.rows = sum(piece.rows for piece in members)
        head = members[0]
        self.index, self.iteration, self.priority = head.index, head.iteration, head.priority
        self.key = head.key if len(members) == 1 else f"{head.key}+{len(members) - 1}"
        self.state = State.READY
        self.start_time = self.finish_time = math.nan

    def __repr__(self) -> str:
        return f"Fused({self.key}, it={self.iteration}, {len(self.members)} pieces, {self.nbytes}B, {self.state.value})"
