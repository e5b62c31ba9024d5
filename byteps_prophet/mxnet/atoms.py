"""The atoms of an MXNet store: how a parameter is cut into fixed pieces and sent and received.

Each user key is pushed as fixed *atoms* (runs of rows from row 0, each under its own store key),
the same on every worker whatever the scheduler cut: FIFO one atom per tensor, ByteScheduler its
partitions, Prophet a grid of ``BYTEPS_PROPHET_ATOM_ELEMENTS``-element runs it also cuts on
(docs/DESIGN.md, "Fixed atoms"). A slice the scheduler sends is sent as the atoms it covers; an atom
it covers only partly is sent whole, at once (its rows are ready), so no byte is sent twice in an
iteration and no slice waits on a later one.

Each atom has its own buffer (its own engine variable: waiting for one atom never waits for another),
staged from the gradient, sent and answered in place. When every atom of a key is back, the buffers
are copied into the caller's arrays under the key's engine gate, which then opens.

The leader issues atoms in its scheduler's order and announces them over the order channel; the
other workers issue the announced atoms in that order, each once their own gradient is staged
(docs/DESIGN.md, "Followers follow the leader's order"), through the
:class:`~byteps_prophet.backends.sync.Synchroniser`.
"""
from __future__ import annotations

import bisect
import copy
import threading
import time
from typing import Any, Callable

import mxnet as mx
import numpy as np

from byteps_prophet.backends.base import Backend, Op, OrderMismatch
from byteps_prophet.backends.sync import Synchroniser
from byteps_prophet.core import EngineTraits, Settings, Task
from byteps_prophet.core.task import atom_grid
from byteps_prophet.errors import UserError
from byteps_prophet.mxnet.gates import EngineGate, Notifier, copy_raw

IDLE, SENT, DONE = 0, 1, 2  # an atom's state in one synchronisation


def atom_elements(settings: Settings, per_partition: int = 4) -> int:
    """Prophet's atom on the store: ``settings.atom_elements``, else ByteScheduler's partition cut in
    ``per_partition``."""
    return settings.atom_elements or max(1, settings.partition // per_partition)


def atom_ranges(shape: tuple[int, ...], scheduler: str, partition: int, atom: int) -> list[tuple[int, int]]:
    """The fixed row ranges one tensor is pushed as, the same on every worker: FIFO the whole tensor,
    ByteScheduler its partitions, Prophet a grid of ``atom``-element runs of rows from row 0, the grid
    it cuts on (``Prophet.cut_elements``)."""
    template = Task("t", 0, shape)
    rows = template.shape[0]
    if scheduler == "fifo":
        return [(0, rows)]
    if scheduler == "prophet":
        return atom_grid(rows, template.row_numel, atom)
    return [(p.row_start, p.row_end) for p in template.partition(partition)]


def trace_instant(trace, kind: str, name: str, iteration: int, **fields) -> None:
    """One event in the store's trace (``trace`` None: no trace)."""
    if trace is not None:
        trace.instant(kind, name, time.monotonic(), iteration=iteration, **fields)


class KeyAtoms:
    """One user key: its atoms, their buffers, and its latest synchronisation."""

    def __init__(self, key, order: int, shape: tuple[int, ...], dtype, atoms: list[tuple[int, int, int]]):
        self.key, self.order, self.shape, self.dtype = key, order, shape, dtype
        self.atoms = atoms  # (row_start, row_end, atom_key)
        self.starts = [a[0] for a in atoms]
        # One buffer per atom, each its own engine variable (slices of one array share one variable in
        # MXNet's engine, so a wait on one atom would wait for its siblings). The gradient's rows are
        # staged in it and the servers' answer lands in it: one engine op per atom and iteration.
        self.atom_bufs: list[mx.nd.NDArray] = []
        # Plain pulls (broadcast, pull) land in their own per-atom buffers; ``pulled`` holds them
        # until the next push of this key, which must not be sent before they are written.
        self.pull_bufs: list[mx.nd.NDArray] = []
        self.pulled: list[mx.nd.NDArray] = []
        self.last: "Synchronisation | None" = None
        self.caller_index = order  # its index as the caller numbers it (Trainer: the priority's -key)
        self.syncs = 0  # synchronisations registered so far: the same count on every worker

    def atoms_between(self, row_start: int, row_end: int) -> range:
        lo = bisect.bisect_right(self.starts, row_start) - 1
        hi = bisect.bisect_left(self.starts, row_end)
        return range(lo, hi)

    def buffers(self, context) -> list[mx.nd.NDArray]:
        """One zeroed buffer per atom, on ``context``."""
        return [mx.nd.zeros((end - start,) + tuple(self.shape[1:]), ctx=context, dtype=self.dtype)
                for start, end, _ in self.atoms]

    def copy_into(self, outs: list, bufs: list, raw: bool = False) -> None:
        """Each atom's buffer into its rows of every array in ``outs`` (``raw``: a memmove, only
        while a gate holds the arrays; else an engine copy)."""
        whole = len(self.atoms) == 1
        for out in outs:
            rows = out.reshape(self.shape)
            for (row_start, row_end, _), buf in zip(self.atoms, bufs):
                target = rows if whole else rows[row_start:row_end]
                if raw:
                    copy_raw(buf, target)
                else:
                    buf.copyto(target)


class KeyTable(dict):
    """Every initialised key's :class:`KeyAtoms`, by user key. Atom keys count up in the order keys
    are cut, so workers that initialise the same keys in the same order number them alike."""

    def __init__(self, settings: Settings, atom: int) -> None:
        super().__init__()
        self._settings = settings
        self.atom_elements = atom  # Prophet's atom (its grid)
        self.atom_count = 0

    def cut(self, key, shape: tuple[int, ...], dtype) -> KeyAtoms:
        """A new key's atoms; it joins the table once initialised (``table[key] = entry``)."""
        if key in self:
            raise UserError(f"ScheduledKVStore: key {key!r} initialised twice")
        ranges = atom_ranges(shape, self._settings.scheduler, self._settings.partition, self.atom_elements)
        atoms = [(row_start, row_end, self.atom_count + i) for i, (row_start, row_end) in enumerate(ranges)]
        self.atom_count += len(atoms)
        return KeyAtoms(key, len(self), shape, dtype, atoms)

    def __missing__(self, key):
        raise UserError(f"ScheduledKVStore: key {key!r} was never initialised (call init first)")


class Synchronisation:
    """One key's synchronisation in one iteration."""

    def __init__(self, key: KeyAtoms, outs: list, token: int | None, index: int, iteration: int,
                 staged: threading.Event):
        self.key, self.outs, self.token = key, outs, token
        self.staged = staged  # its gradient is in the atoms' buffers
        self.task = Task(name=str(key.key), index=index, shape=key.shape,
                         itemsize=np.dtype(key.dtype).itemsize, iteration=iteration, payload=self)
        self.state = [IDLE] * len(key.atoms)
        self.waiting: list[list[Task]] = [[] for _ in key.atoms]
        self.sent_count = 0
        key.syncs += 1
        self.seq = key.syncs  # which synchronisation of its key this is (every worker counts the same)
        self.ready = False  # its gradient is staged (the leader's probe saw it, or a follower's staging)
        self.atoms_done = 0
        self.done = threading.Event()  # every row synchronised
        self.delivered = threading.Event()  # ... and copied into ``outs``: the atom buffers are free


def atom_op(sync: Synchronisation, j: int, index: int) -> Op:
    """Atom ``j`` of ``sync`` as the Synchroniser's op: the key's order and which synchronisation of
    it this is (the same on every worker) name it; the atom's rows are its rows."""
    row_start, row_end, _ = sync.key.atoms[j]
    return Op(sync.key.order, sync.seq, row_start, row_end, extra={"sync": sync, "atom": j, "index": index})


def optimizer_for_atoms(optimizer, keys: list[KeyAtoms]):
    """A copy of ``optimizer`` keyed by atom keys: each atom gets its parameter's entries (name,
    lr/wd multipliers), so the servers' optimizer runs per atom as it would per parameter."""
    opt = copy.copy(optimizer)
    index_of = {}
    for entry in keys:
        user_index = entry.key if isinstance(entry.key, int) else entry.order
        for _, _, atom_key in entry.atoms:
            index_of[atom_key] = user_index
    opt.param_dict = {a: optimizer.param_dict[i] for a, i in index_of.items() if i in optimizer.param_dict}
    opt.idx2name = {a: optimizer.idx2name[i] for a, i in index_of.items() if i in optimizer.idx2name}
    for attr in ("lr_mult", "wd_mult"):
        table = getattr(optimizer, attr)
        remapped = {k: v for k, v in table.items() if not isinstance(k, int)}
        remapped.update({a: table[i] for a, i in index_of.items() if i in table})
        setattr(opt, attr, remapped)
    return opt


class AtomSender:
    """The scheduler's transport on a store: ``send(piece)`` issues the atoms the piece covers (the
    leader's order, announced to the followers), MXNet's engine reports each atom's answer, and a
    finished key's result is delivered into its arrays under its gate.

    ``lock`` is the store's (the scheduler and every call into the real store); ``transfer(atom_key,
    buf, priority)`` sends one atom's buffer and receives the answer into it without waiting."""

    def __init__(self, *, traits: EngineTraits, lock: threading.RLock, rank: int, size: int, channel, mirror: bool,
                 gate: EngineGate, notifier: Notifier, trace, on_error: Callable[[BaseException], None],
                 transfer: Callable[[int, Any, int], None]) -> None:
        self.traits = traits  # what the scheduler reads of its transport
        self._lock, self._gate, self._notifier, self.trace = lock, gate, notifier, trace
        self.mirror = mirror  # a follower: issues the leader's announced atoms
        self.transfer = transfer
        self.scheduler = None  # set by the store once it made the scheduler over this transport
        self._pending: dict[int, int] = {}  # id(piece) -> atoms it still waits for
        self._completed: list[Synchronisation] = []
        self._issued: dict[tuple[int, int], float] = {}  # (id(sync), atom) -> when it was issued
        self._stopped = False
        self._sync = Synchroniser(_AtomOps(self, rank, size, channel), lambda op: None, on_error,
                                  leader=not mirror, inline=True, make_op=self._announced_atom)

    @property
    def closed_by_leader(self) -> bool:
        return self._sync.closed_by_leader

    def close(self, timeout: float) -> None:
        self._sync.close(timeout=timeout)

    def stop(self) -> None:
        """Issue nothing more (the process leaves alone; the order channel closes with it)."""
        self._stopped = True

    # -- the leader: the scheduler's sends -------------------------------------------------------------
    def send(self, piece: Task) -> None:  # called with the lock held
        trace_instant(self.trace, "send", piece.name, piece.iteration, rows=[piece.row_start, piece.row_end])
        sync: Synchronisation = piece.root.payload
        waiting = 0
        issued = []
        for j in sync.key.atoms_between(piece.row_start, piece.row_end):
            if sync.state[j] == DONE:
                continue
            waiting += 1
            sync.waiting[j].append(piece)
            if sync.state[j] == IDLE:
                sync.state[j] = SENT
                issued.append(atom_op(sync, j, piece.index))
        if issued:
            self._sync.submit(*issued)  # issued now (issue), then announced to the followers
        if waiting == 0:
            self.scheduler.finished(piece)
        else:
            self._pending[id(piece)] = waiting

    def on_done(self, task: Task) -> None:  # the scheduler's on_done, with the lock held
        trace_instant(self.trace, "done", task.name, task.iteration)
        self._completed.append(task.payload)

    # -- followers: the leader's order -----------------------------------------------------------------
    def follower_ready(self, sync: Synchronisation) -> None:  # with the lock held, the gradient staged
        if sync.ready:
            return
        trace_instant(self.trace, "ready", sync.task.name, sync.task.iteration)
        sync.ready = True
        self._sync.local_ready(sync.seq, sync.key.order, sync)

    def _announced_atom(self, order: int, seq: int, row_start: int, row_end: int, sync: Synchronisation,
                        rank: int) -> Op:
        """The Synchroniser's follower op for an announced atom of this worker's staged ``sync``."""
        entry = sync.key
        span = entry.atoms_between(row_start, row_end)
        if len(span) != 1 or entry.atoms[span[0]][:2] != (row_start, row_end):
            raise OrderMismatch(f"worker 0 synchronises rows {row_start}:{row_end} of key {entry.key!r} but worker "
                                f"{rank}'s atoms of it are {[a[:2] for a in entry.atoms]} (different models "
                                f"or settings on different workers?)")
        return atom_op(sync, span[0], sync.task.index)

    # -- both: issue, answer, deliver ------------------------------------------------------------------
    def issue(self, sync: Synchronisation, j: int, index: int) -> None:  # with the lock held
        if self._stopped:
            return
        entry = sync.key
        sync.state[j] = SENT
        if self.trace is not None:
            self._issued[id(sync), j] = time.monotonic()
        buf = entry.atom_bufs[j]
        self.transfer(entry.atoms[j][2], buf, -index)
        sync.sent_count += 1
        if self.mirror and sync.sent_count == len(entry.atoms):
            self._sync.forget(sync.seq, entry.order)
        self._notifier.when_free([buf], [], lambda: self._atom_done(sync, j))

    def _atom_done(self, sync: Synchronisation, j: int) -> None:  # an engine worker, the answer written
        with self._lock:
            if self.trace is not None:
                row_start, row_end, _ = sync.key.atoms[j]
                self.trace.span("atom", f"{sync.task.name} atom {j}", self._issued.pop((id(sync), j)),
                                time.monotonic(), iteration=sync.task.iteration, atom=j, seq=sync.seq,
                                rows=[row_start, row_end])
            sync.state[j] = DONE
            sync.atoms_done += 1
            if self.mirror and sync.atoms_done == len(sync.key.atoms):
                self.on_done(sync.task)
            pieces, sync.waiting[j] = sync.waiting[j], []
            for piece in pieces:
                self._pending[id(piece)] -= 1
                if self._pending[id(piece)] == 0:
                    del self._pending[id(piece)]
                    self.scheduler.finished(piece)
        self.deliver_finished()

    def deliver_finished(self) -> None:
        """Copy finished keys' results into their arrays and open their gates (call without the lock)."""
        with self._lock:
            done, self._completed = self._completed, []
        for sync in done:
            if sync.token is None:
                sync.done.set()
                sync.delivered.set()
                continue

            def deliver(sync=sync):
                try:
                    sync.key.copy_into(sync.outs, sync.key.atom_bufs, raw=True)
                finally:
                    sync.delivered.set()

            self._gate.release(sync.token, deliver)
            sync.done.set()


class _AtomOps(Backend):
    """The store's atoms as the Synchroniser's backend: ``issue`` hands an atom to the sender, and
    MXNet's engine reports its completion, so ``issue`` returns no handle."""

    name = "mxnet-store"

    def __init__(self, sender: AtomSender, rank: int, size: int, channel) -> None:
        super().__init__()
        self.rank, self.size = rank, size
        self._sender, self._channel = sender, channel

    def channel(self):
        return self._channel

    def issue(self, op: Op) -> None:
        with self._sender._lock:  # re-entered on the leader (the scheduler's send holds it)
            self._sender.issue(op.extra["sync"], op.extra["atom"], op.extra["index"])
        return None
