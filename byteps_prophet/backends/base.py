"""The backend contract: what the plugins need from a communication engine.

An :class:`Op` is one synchronisation: rows ``[row_start, row_end)`` (dim 0) of one gradient of one
iteration, stored in ``tensor`` (a 2-D, contiguous view of those rows, synchronised in place). A
:class:`Backend` issues ops and reports when each is done; afterwards ``tensor`` holds the average over
all workers. Backends never see the scheduler (it sees only its
:class:`~byteps_prophet.core.scheduler.Transport`, the plugin): once training runs the
:class:`~byteps_prophet.backends.sync.Synchroniser` is their only caller (docs/DESIGN.md, "Followers
follow the leader's order"). The promises, method by method, are in :class:`Backend`.
"""
from __future__ import annotations

import importlib
import sys

from dataclasses import dataclass, field
from typing import Any, Iterable

from byteps_prophet.core.traits import EngineTraits
from byteps_prophet.core.settings import Settings
from byteps_prophet.errors import ConfigError


def exiting_on_error() -> bool:
    """Whether the interpreter is leaving after an unhandled exception (Ctrl-C too): Python sets
    ``sys.last_value`` before the exit handlers run. A plugin then closes alone: the other ranks may be
    blocked on this one, and its launcher ends the job once it exits."""
    return getattr(sys, "last_value", None) is not None


def close_each(live: Iterable, what: str) -> None:
    """The plugins' exit handler: ``close(alone=...)`` every object still open, each whatever the
    others do; a failure is one line on stderr naming ``what`` was not closed."""
    alone = exiting_on_error()
    for obj in list(live):
        try:
            obj.close(alone=alone)
        except Exception as err:  # noqa: BLE001 - the others must still close
            print(f"byteps-prophet: {what} not closed cleanly: {err}", file=sys.stderr, flush=True)


class BackendError(RuntimeError):
    """Synchronisation failed (a peer died, a collective failed); the message says which and why."""


class OrderMismatch(BackendError):
    """Ranks disagree on what to synchronise next: continuing would corrupt or hang, so stop."""


@dataclass(eq=False)
class Op:
    name: str  # gradient (parameter) name
    iteration: int
    row_start: int
    row_end: int
    tensor: Any = None  # the rows to synchronise in place (2-D view)
    whole: Any = None  # the whole gradient (2-D) those rows belong to
    piece: Any = None  # the scheduler's slice task (leader only)
    seq: int = -1  # position in the global order
    extra: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.name}[{self.row_start}:{self.row_end}]"

    def describe(self) -> list:
        return [self.name, self.iteration, self.row_start, self.row_end]


@dataclass(eq=False)
class FusedOp(Op):
    """Several ops synchronised as one message (Prophet's fused collective, docs/DESIGN.md, "Fused
    collectives"): on an all-reduce, one collective of their rows concatenated, copied back into each
    member's ``tensor`` and averaged once. ``name`` and the rows are the first member's; the followers
    learn the members from the announcement (``describe``'s fifth field)."""

    members: list = field(default_factory=list)

    @classmethod
    def of(cls, members: list[Op], piece: Any = None) -> "FusedOp":
        head = members[0]
        return cls(head.name, head.iteration, head.row_start, head.row_end, piece=piece, members=members)

    @property
    def key(self) -> str:
        return f"{self.members[0].key}+{len(self.members) - 1} fused"

    def describe(self) -> list:
        return [*super().describe(), [[m.name, m.row_start, m.row_end] for m in self.members]]


class Backend:
    """Base class of every backend; a subclass sets ``traits`` and implements ``issue`` (and ``wait``
    unless it reports completions itself).

    Attributes, fixed once the backend is made: ``name`` (the ``BYTEPS_PROPHET_BACKEND`` value or an
    engine's name, for messages and traces), ``rank`` and ``size`` (this worker's place in the job),
    ``traits`` (:class:`~byteps_prophet.core.traits.EngineTraits`: how often each byte crosses the
    bottleneck link, 2 for a parameter server's push then pull, 1 for an all-reduce; whether pulls
    follow pushes), ``accepts_fused`` (it synchronises a :class:`FusedOp` as one message: Prophet then
    fuses; otherwise it never receives one).

    Threads and order: ``issue`` is called from one thread at a time (the Synchroniser's issuer
    thread, or an inline leader's caller under the Synchroniser's lock), in one global order that is
    the same on every rank, so every rank issues the same ops, cut at the same rows, in the same order.
    ``wait`` is called from one other thread (the waiter), once per handle, in issue order. ``issue``
    must not block on the completion of an op issued after it; ``wait`` may block, bounded by
    ``BYTEPS_PROPHET_TIMEOUT`` (``timeout_s``): a dead peer becomes an error, never a hang.

    Errors: an op that cannot complete raises :class:`BackendError` from ``issue`` or ``wait``, one line
    naming this rank, the op (``op.key``, ``op.iteration``) and the likely cause; the Synchroniser then
    stops both threads and the training thread raises it. A bad configuration raises ``ConfigError``
    when the backend is made or set up.
    """

    name = "base"
    traits = EngineTraits(name="local")
    accepts_fused = False

    def __init__(self) -> None:
        self.rank = 0
        self.size = 1

    def setup(self) -> None:
        """Connect to the job and set ``rank`` and ``size``; a backend that needs it calls it itself
        as it is made (TorchDistBackend does), so a made backend is connected."""

    def use_atoms(self, elements: int) -> int:
        """Slices that vary from iteration to iteration (Prophet's cuts) are coming. A backend for which
        every distinct slice is a new key to set up sends fixed atoms of about ``elements`` instead
        and returns that size, which the scheduler then cuts on; 0: any slice costs the same. Called
        once, before the first op, on every rank alike."""
        return 0

    def channel(self):
        """The announcement channel (backends/channel.py) on which rank 0 tells the others the order;
        None for one worker. The Synchroniser closes it; the backend owns what it runs on."""
        return None

    def issue(self, op: Op) -> Any:
        """Start synchronising ``op`` without waiting for it; a handle for ``wait``, or None where the
        backend reports the completion itself (the MXNet store's engine does)."""
        raise NotImplementedError

    def wait(self, handle: Any) -> None:
        """Block until the op of ``handle`` is done: its ``tensor`` (each member's, for a FusedOp) holds
        the average over all workers."""
        raise NotImplementedError

    def close(self, together: bool = True) -> None:
        """Leave the job, after the last ``wait`` returned (or after a failure). ``together``: first
        wait for the other ranks to leave too, so that none tears down what a peer still uses; False
        after a failure, where a peer may never come."""


class LocalBackend(Backend):
    """One worker, no network: every op is complete as soon as it is issued (tests, single process)."""

    name = "local"

    def issue(self, op: Op) -> Any:
        return op

    def wait(self, handle: Any) -> None:
        return None


def timeout_s(environ=None) -> float:
    """``BYTEPS_PROPHET_TIMEOUT`` (Settings.timeout, seconds, default 300): how long a rank waits for
    its peers to connect or answer before it fails, naming what it waited for."""
    return Settings.from_env(environ).timeout


def import_byteps(plugin: str, instead: str):
    """``byteps.<plugin>``, or a one-line ConfigError saying how to get it and what to use instead."""
    try:
        return importlib.import_module(f"byteps.{plugin}")
    except ImportError as err:
        raise ConfigError(f"backend byteps: byteps.{plugin} is not importable ({err}); "
                          f"valid: build it with scripts/build_byteps.sh, or {instead}") from None
