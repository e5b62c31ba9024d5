"""A scheduled KVStore for MXNet 1.9: FIFO, ByteScheduler or Prophet decide when each slice moves.

``ScheduledKVStore(mx.kv.create('dist_sync'))`` (or :func:`create`) is a ``KVStoreBase``, so Gluon's
``Trainer(kvstore=kv)`` and ``Module.fit(kvstore=kv)`` take it as is. It intercepts ``push``,
``pull`` and ``pushpull`` (Trainer and Module call ``pushpull`` in 1.9; a wrapper that only hooks
push/pull is silently bypassed).

Per ``pushpull(key, grad, out=weight)``, all in the caller's thread and without waiting:

1. the gradient's rows are copied into its atoms' buffers by an engine op on the engine's
   prioritised workers (so the next backward may overwrite the gradient whenever the scheduler gets
   round to it, and the copy does not wait behind backward's compute on the normal CPU worker);
2. an engine *gate* is pushed that holds ``out`` (see ``engine.py``): the next forward of this layer,
   and only of this layer, waits for it;
3. a task is registered for the readiness probe.

A probe thread waits for the staged gradients in backward order and posts each to the scheduler;
after the last it calls ``end_of_backward``. Backward order is the reverse of each key's place in the
forward pass, the schedulers' priority (``forward_index``), which the store learns from the order the
engine stages the gradients: MXNet's Trainer numbers its keys by sorted parameter name (``blocks10``
before ``blocks2``, a transformer's embedding after its blocks), not in the order the forward pass
reads them. Learned once, the order is fixed, so the probe never follows one step's staging order
(which differs from worker to worker); FIFO's workers, which share no order, keep the caller's
numbering (``_learn_forward_order``).

The scheduler ``send``s slices; each slice maps to the fixed *atoms* it covers (rows along dim 0,
each pushed and pulled under its own key, initialised once), so every worker pushes the same keys
whatever the scheduler cut. An atom a slice only partly covers is sent whole, at once (its data is
ready), so no byte is sent twice in an iteration and no slice waits on a later one. Each atom has
its own buffer (its own engine variable, so waiting for one atom never waits for another), sent and
answered in place by one ``pushpull``. When every row of a gradient is synchronised the atoms'
buffers are copied into ``out`` under the gate and the gate completes; the key's next registration
waits for that copy.

One worker, the leader, schedules; it announces each atom it issues over an order channel
(``SocketChannel``), and the other workers issue the same atoms in that order, each once their own
gradient is staged (a key completes only when every worker pushed it, so a follower's order decides
as much as the leader's). The order goes through the torch plugin's
:class:`~byteps_prophet.backends.sync.Synchroniser` (inline on the leader: issued in the scheduler's
call, under the store's lock); an op there is one atom of one synchronisation of one key.

Atoms: FIFO one per tensor (what MXNet does), ByteScheduler its partitions, Prophet a grid of
``BYTEPS_PROPHET_ATOM_ELEMENTS``-element runs of rows from row 0 (default partition / 4), so its finer
cuts are honoured; its cuts end on the same grid (``Prophet.cut_elements``): a slice finer than an
atom only cost a send (resnet: 600-770 sends a step for 107 atoms before, at most about 100 now).

Values are exactly those of the unscheduled store: each row is summed once per iteration by the
server, and with ``update_on_kvstore`` the server's optimizer (elementwise: SGD, NAG, Adam, ...) runs
per atom with the parameter's own lr/wd multipliers (the optimizer is re-keyed before it is sent).
"""
from __future__ import annotations

import atexit
import bisect
import contextlib
import copy
import itertools
import os
import sys
import threading
import time
import traceback
import weakref
from collections import deque
from typing import Any

import mxnet as mx
import numpy as np
from mxnet.base import _LIB, check_call
from mxnet.kvstore import KVStoreBase

from byteps_prophet.backends.base import Backend, Op, OrderMismatch
from byteps_prophet.backends.channel import SocketChannel, order_channel
from byteps_prophet.backends.rendezvous import rendezvous
from byteps_prophet.backends.sync import Synchroniser
from byteps_prophet.core.link_monitor import link_monitor
from byteps_prophet.backends.wakeup import install_wakeup_timer
from byteps_prophet.core import EngineTraits, MonotonicClock, Settings, Task, make_scheduler
from byteps_prophet.core.task import atom_grid
from byteps_prophet.core.trace import TraceLog, trace_path, writable
from byteps_prophet.errors import UserError
from byteps_prophet.mxnet.gates import EngineGate, Notifier, copy_raw

IDLE_CLOSE_S = 0.1  # no pushpull for this long closes the step (unused parameters never come)
_IDLE, _SENT, _DONE = 0, 1, 2


def create(kvstore: str | Any = "dist_sync", settings: Settings | None = None, **kwargs) -> "ScheduledKVStore":
    """``ScheduledKVStore`` around ``mx.kv.create(kvstore)`` (or around a store you created)."""
    real = mx.kv.create(kvstore) if isinstance(kvstore, str) else kvstore
    return ScheduledKVStore(real, settings=settings, **kwargs)


def is_leader(kvstore, environ=None) -> bool:
    """The one worker that schedules: the host with ``DMLC_WORKER_ID=0`` in a dist job (a cluster's
    worker-0, where runners read output; ps-lite numbers ranks by connection order, so its rank 0 may
    be another host), else ps-lite rank 0. Any single leader is correct: the others follow its order."""
    worker_id = rendezvous(environ).worker_id
    if "dist" in kvstore.type and worker_id is not None:
        return worker_id == 0
    return kvstore.rank == 0


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


class _Key:
    """One user key: its atoms, staging buffers, and its latest synchronisation."""

    def __init__(self, key, order: int, shape: tuple[int, ...], dtype, atoms: list[tuple[int, int, int]]):
        self.key, self.order, self.shape, self.dtype = key, order, shape, dtype
        self.atoms = atoms  # (row_start, row_end, atom_key)
        self.starts = [a[0] for a in atoms]
        # One buffer per atom, each its own engine variable (slices of one array share one variable in
        # MXNet's engine, so a wait on one atom would wait for its siblings). The gradient's rows are
        # staged in it and the servers' answer lands in it: one engine op per atom and iteration.
        self.abufs: list[mx.nd.NDArray] = []
        # Plain pulls (broadcast, pull) land in their own per-atom buffers; ``pulled`` holds them
        # until the next push of this key, which must not be sent before they are written.
        self.pbufs: list[mx.nd.NDArray] = []
        self.pulled: list[mx.nd.NDArray] = []
        self.last: "_Sync | None" = None
        self.caller_index = order  # its index as the caller numbers it (Trainer: the priority's -key)
        self.syncs = 0  # synchronisations registered so far: the same count on every worker

    def atoms_between(self, row_start: int, row_end: int) -> range:
        lo = bisect.bisect_right(self.starts, row_start) - 1
        hi = bisect.bisect_left(self.starts, row_end)
        return range(lo, hi)


class _Staged(threading.Event):
    """Set once the key's gradient is in the staging buffer; ``order`` says when, among all stagings."""

    order = -1


class _Sync:
    """One key's synchronisation in one iteration."""

    def __init__(self, key: _Key, outs: list, token: int | None, index: int, iteration: int,
                 staged: _Staged):
        self.key, self.outs, self.token = key, outs, token
        self.staged = staged  # its gradient is in the staging buffer
        self.task = Task(name=str(key.key), index=index, shape=key.shape,
                         itemsize=np.dtype(key.dtype).itemsize, iteration=iteration, payload=self)
        self.state = [_IDLE] * len(key.atoms)
        self.waiting: list[list[Task]] = [[] for _ in key.atoms]
        self.sent_count = 0
        self.seq = 0  # which synchronisation of its key this is (every worker counts the same)
        self.ready = False  # its gradient is staged (the leader's probe saw it, or a follower's _stage)
        self.atoms_done = 0
        self.done = threading.Event()  # every row synchronised
        self.delivered = threading.Event()  # ... and copied into ``outs``: the atom buffers are free


class ScheduledKVStore(KVStoreBase):
    # A key's values come back only after its push: the store's traits say so (pulls_follow_pushes), and
    # Prophet follows the rules of docs/DESIGN.md for such engines. On dist_sync the values ride in the
    # pushpull's reply (no pull request queued behind later pushes: the engine profile's pull_in_reply,
    # docs/ENGINE.md), which the simulator models; the scheduling rules were not revisited for it.
    # Prophet's default atom: ByteScheduler's partition cut in this many (docs/MXNET.md, "Transport").
    atoms_per_partition = 4
    engine_name = "kvstore"

    def __init__(self, kvstore, settings: Settings | None = None, *, clock=None,
                 idle_close_s: float = IDLE_CLOSE_S) -> None:
        self.settings = Settings.from_env() if settings is None else settings
        self._atom = atom_elements(self.settings, per_partition=self.atoms_per_partition)
        self._real = kvstore
        self._lock = threading.RLock()  # the scheduler and every call into the real store
        self._clock = clock or MonotonicClock()
        # Only one worker (the leader, see is_leader) schedules. In dist_sync a key's round completes
        # only when every worker pushed it, so two workers each holding a window of keys the other has
        # not sent yet would wait for each other forever; the leader's order becomes the global order.
        # The others issue the leader's atoms in that order, each once their own copy is ready (they
        # "mirror" it): a follower that sent every gradient when ready would queue its bulk ahead of
        # the urgent pieces the leader held back.
        self.leader = is_leader(self)  # self: a subclass may say what its transport is
        if self.settings.trace:  # before any thread or socket starts
            writable(trace_path(self.settings.trace, self.rank, primary=self.leader))
        self._channel = self._order_channel()
        self._mirror = self._channel is not None and not self.leader
        local = self.settings if self.leader else self.settings.replace(scheduler="fifo")
        # A push then a pull cross the link, and Prophet's slices finer than an atom only cost sends.
        self.traits = EngineTraits(name=self.engine_name, stages=2, pulls_follow_pushes=True,
                                   atom_elements=self._atom if local.scheduler == "prophet" else 0)
        # ps-lite/BytePS ops pay a start-up latency that ops in flight overlap: the LinkMonitor
        monitor = link_monitor(self.settings, self.traits.stages) if self.leader else None
        self.scheduler = make_scheduler(local, self._clock, self, self._on_done, monitor=monitor)
        self._timer = install_wakeup_timer(self.scheduler, self._tick, self._fail) if self.leader else None
        self._gate = EngineGate()
        self._keys: dict[Any, _Key] = {}
        self._next_atom_key = 0
        self._optimizer = None
        self._optimizer_keys = -1  # how many atoms the optimizer sent to the servers knows
        self._pending: dict[int, int] = {}  # id(piece) -> atoms it still waits for
        self._completed: list[_Sync] = []
        # Staged gradients and finished atoms are reported by engine ops on the prioritised workers:
        # a thread in wait_to_read would wait behind backward's compute to learn either.
        self._notifier = Notifier(self._fail)
        self._stagings = itertools.count()  # the engine's staging order (_Staged.order)
        self._forward_index: dict = {}  # key -> its place in the forward pass, learned by the probe
        # Step registration, guarded by _cv.
        self._cv = threading.Condition()
        self._iteration = 0
        self._step: list[_Sync] = []
        self._step_keys: set = set()
        self._expected: set | None = None
        # The keys of the steps closed idle since the last step closed otherwise: a step registered
        # after an idle close continues their iteration, until one of them comes again (the next one)
        self._continued: set = set()
        self._last_register = 0.0
        self._closed_steps: deque[tuple[int, list[_Sync]]] = deque()
        self._idle_close_s = idle_close_s
        self._error: BaseException | None = None
        self._stopping = False
        self.steps_closed_idle = 0
        self._blocked = 0
        # BYTEPS_PROPHET_TRACE=PATH: every ready/send/atom/done as a Chrome trace (core/trace.py), written
        # at close by the leader to PATH and by every other worker beside it (docs/MXNET.md, "Trace").
        self.trace = TraceLog(self.rank, f"worker {self.rank}") if self.settings.trace else None
        self._issued: dict[tuple[int, int], float] = {}  # (id(sync), atom) -> when it was issued
        # The order: a mirroring follower issues the leader's announced atoms; every other worker
        # issues its own scheduler's, announcing them if it has a channel (the leader).
        self._sync = Synchroniser(_AtomOps(self, self._channel), lambda op: None, self._fail,
                                  leader=not self._mirror, inline=True, make_op=self._announced_atom)
        self._probe = threading.Thread(target=self._probe_loop, name="bpp-mx-probe", daemon=True)
        self._probe.start()
        self._closed = False
        _LIVE_STORES.add(self)

    def _order_channel(self) -> SocketChannel | None:
        """Worker 0 announces its order to the others over a socket at ``MASTER_ADDR:MASTER_PORT``
        (the cluster sets both); FIFO needs no order, and without ``MASTER_ADDR`` the followers send
        each gradient when it is ready, as before (said once, by the leader)."""
        if self.settings.scheduler == "fifo" or "dist" not in self.type or self.num_workers < 2:
            return None
        channel = order_channel(self.leader, self.num_workers - 1)
        if channel is None and self.leader:
            sys.stderr.write("byteps_prophet: no MASTER_ADDR (worker 0's address): the other workers send "
                             "each gradient when it is ready, not in the scheduler's order\n")
        return channel

    @property
    def forward_index(self) -> dict:
        """Each key's place in the forward pass (0: read first), learned from the order the engine
        staged the gradients of one step (the reverse); empty until such a step was seen."""
        return dict(self._forward_index)

    # -- KVStoreBase surface -------------------------------------------------------------------------
    @property
    def type(self) -> str:
        return self._real.type

    @property
    def rank(self) -> int:
        return self._real.rank

    @property
    def num_workers(self) -> int:
        return self._real.num_workers

    @staticmethod
    def is_capable(capability: str) -> bool:
        return capability.lower() == KVStoreBase.OPTIMIZER

    def set_optimizer(self, optimizer) -> None:
        """Kept and sent on the first push, re-keyed from user keys to atom keys."""
        self._optimizer = optimizer
        self._optimizer_keys = -1
        if "dist" not in self.type:
            self._real.set_optimizer(optimizer)
            self._optimizer_keys = self._next_atom_key

    def set_gradient_compression(self, compression_params) -> None:
        raise UserError("ScheduledKVStore: gradient compression is not supported with scheduling")

    def save_optimizer_states(self, fname, dump_optimizer=False):
        self.flush()
        return self._real.save_optimizer_states(fname, dump_optimizer)

    def load_optimizer_states(self, fname):
        self.flush()
        return self._real.load_optimizer_states(fname)

    def _barrier(self):
        self.flush()
        return self._real._barrier()

    def __getattr__(self, name):  # anything else (e.g. _set_updater) goes to the real store
        if name.startswith("__") or name == "_real":
            raise AttributeError(name)
        return getattr(self._real, name)

    # -- init / broadcast / pull ---------------------------------------------------------------------
    def init(self, key, value) -> None:
        for k, v in zip(*_pairs(key, value)):
            self._init_one(k, _first(v))

    def broadcast(self, key, value, out, priority=0) -> None:
        keys, values = _pairs(key, value)
        outs = _pairs(key, out)[1]
        for k, v, o in zip(keys, values, outs):
            self._init_one(k, _first(v))
            self._pull_one(k, _as_list(o), priority)

    def pull(self, key, out=None, priority=0, ignore_sparse=True) -> None:
        keys, outs = _pairs(key, out)
        for k, o in zip(keys, outs):
            self._pull_one(k, _as_list(o), priority)

    def _init_one(self, key, value: mx.nd.NDArray) -> None:
        if key in self._keys:
            raise UserError(f"ScheduledKVStore: key {key!r} initialised twice")
        shape = tuple(value.shape) or (1,)
        ranges = atom_ranges(shape, self.settings.scheduler, self.settings.partition, self._atom)
        atoms = []
        for row_start, row_end in ranges:
            atoms.append((row_start, row_end, self._next_atom_key))
            self._next_atom_key += 1
        entry = _Key(key, len(self._keys), shape, value.dtype, atoms)
        self._init_atoms(entry, value.reshape(shape))
        self._keys[key] = entry

    def _init_atoms(self, entry: _Key, value: mx.nd.NDArray) -> None:
        """Initialise every atom of a new key on the servers with ``value``."""
        atoms = entry.atoms
        value.wait_to_read()  # the init push must not wait in the engine (see below)
        with self._lock:
            self._real.init([a[2] for a in atoms], [value[a[0]:a[1]] for a in atoms])
        if "dist" in self.type:
            # MXNet 1.9's dist init pushes from rank 0 without waiting for the server, so another
            # worker's first pull can overtake it and abort the server ("init K first"): let rank 0's
            # push land, then meet. Not under the lock: engine ops still to run may report to this
            # store (Notifier), and they take it.
            if self.rank == 0:
                mx.nd.waitall()
            with self._lock:
                self._real._barrier()

    def _pull_one(self, key, outs: list, priority: int) -> None:
        """Pull into per-atom buffers, then copy into ``outs`` (engine ops, no wait).

        The pull must reach the server before this worker's next push of the key: in dist_sync without
        a server optimizer the server replaces the value with the merged push once every worker
        pushed, so a pull served later returns a gradient sum. MXNet orders nothing between the two
        (on CPU its push sends the gradient array itself, the pull writes another buffer). Gluon's
        first ``Trainer.step`` issues the broadcast's pull *after* backward, right before the first
        gradient push, so the stock store can hand a worker the gradient sum as its initial parameter
        (docs/MXNET.md). Here the next push of the key waits until these buffers are written."""
        entry = self._entry(key)
        if entry.last is not None:
            self._wait(entry.last.delivered)  # MXNet pulls into the buffer the last pushpull answered in
        if not outs:
            return
        if not entry.pbufs:
            entry.pbufs = [mx.nd.zeros((end - start,) + tuple(entry.shape[1:]), ctx=outs[0].context,
                                       dtype=entry.dtype) for start, end, _ in entry.atoms]
        with self._lock:
            for (_, _, atom_key), buf in zip(entry.atoms, entry.pbufs):
                self._real.pull(atom_key, out=buf, priority=priority)
        for out in outs:
            rows = out.reshape(entry.shape)
            for (row_start, row_end, _), buf in zip(entry.atoms, entry.pbufs):
                buf.copyto(rows[row_start:row_end] if len(entry.atoms) > 1 else rows)
        entry.pulled = entry.pbufs

    # -- push / pushpull: scheduled ----------------------------------------------------------------------
    def push(self, key, value, priority=0) -> None:
        keys, values = _pairs(key, value)
        for k, v in zip(keys, values):
            self._register(k, _as_list(v), [], priority)

    def pushpull(self, key, value, out=None, priority=0) -> None:
        keys, values = _pairs(key, value)
        outs = values if out is None else _pairs(key, out)[1]
        for k, v, o in zip(keys, values, outs):
            self._register(k, _as_list(v), _as_list(o), priority)

    def _register(self, key, values: list, outs: list, priority: int) -> None:
        self._raise_error()
        if self._sync.closed_by_leader:
            raise RuntimeError("ScheduledKVStore: worker 0 closed the order channel (it finished or left)")
        entry = self._entry(key)
        with self._cv:
            if key in self._step_keys or key in self._continued:  # the same key again: a new step began
                self._close_step()
                self._continued = set()
        if entry.last is not None and not entry.last.delivered.is_set():
            with self._registering():
                self._wait(entry.last.delivered)  # the atom buffers still hold its rows or its result
        self._send_optimizer()
        if not entry.abufs:
            entry.abufs = [mx.nd.zeros((end - start,) + tuple(entry.shape[1:]), ctx=values[0].context,
                                       dtype=entry.dtype) for start, end, _ in entry.atoms]
        shaped = [v.reshape(entry.shape) for v in values]
        after_pull, entry.pulled = entry.pulled, []
        staged = _Staged()
        registered: list[_Sync] = []  # filled below; the staging op may run before or after that
        self._stage(entry, shaped, after_pull, staged, registered)
        token = self._gate.hold(outs) if outs else None
        entry.caller_index = -priority if priority < 0 else (key if isinstance(key, int) and key >= 0 else entry.order)
        with self._cv:
            sync = _Sync(entry, outs, token, self._index(entry), self._iteration, staged)
            entry.syncs += 1
            sync.seq = entry.syncs
            if self._mirror:
                with self._lock:
                    registered.append(sync)
                    if staged.is_set():
                        self._follower_ready(sync)
            entry.last = sync
            self._step.append(sync)
            self._step_keys.add(key)
            self._last_register = time.monotonic()
            if self._expected is not None and self._step_keys >= self._expected:
                self._close_step()
            self._cv.notify_all()

    def _stage(self, entry: _Key, grads: list, after_pull: list, staged: _Staged,
               registered: list) -> None:
        """Copy the gradient into the staging buffer once it is written (and any plain pull of the key
        has landed), then set ``staged``. Pushed before the gate: with the optimizer on the worker the
        gate holds the gradient itself. A follower's synchronisation is ready to issue the leader's
        atoms as soon as it is staged, not when its step closes: a step closes at the next
        registration, and that may wait for atoms the leader sends only once this worker pushed."""
        row_bytes = int(np.prod(entry.shape[1:], dtype=np.int64)) * np.dtype(entry.dtype).itemsize

        def stage():
            if len(grads) == 1:
                for (row_start, _, _), buf in zip(entry.atoms, entry.abufs):
                    copy_raw(grads[0], buf, row_start * row_bytes)
            with self._lock:
                staged.order = next(self._stagings)
                staged.set()
                if self._mirror and registered:
                    self._follower_ready(registered[0])
            self._after_lock()

        if len(grads) > 1:  # one gradient per device: their sum is staged
            whole = len(entry.atoms) == 1
            for (row_start, row_end, _), buf in zip(entry.atoms, entry.abufs):
                mx.nd.add_n(*[g if whole else g[row_start:row_end] for g in grads], out=buf)
            self._notifier.when_free(entry.abufs + after_pull, [], stage)
        else:
            self._notifier.when_free([grads[0]] + after_pull, entry.abufs, stage)

    def _follower_ready(self, sync: _Sync) -> None:  # with _lock held, the gradient staged
        if sync.ready:
            return
        self._trace("ready", sync.task.name, sync.task.iteration)
        sync.ready = True
        self._sync.local_ready(sync.seq, sync.key.order, sync)

    @contextlib.contextmanager
    def _registering(self):
        """A registration waits: the step is not idle meanwhile (the probe must not close it)."""
        with self._cv:
            self._blocked += 1
        try:
            yield
        finally:
            with self._cv:
                self._blocked -= 1
                self._last_register = time.monotonic()

    def _send_optimizer(self) -> None:
        if self._optimizer is None or self._optimizer_keys == self._next_atom_key or "dist" not in self.type:
            return
        self.flush()  # re-sending resets server-side state; never with a step in flight
        opt = copy.copy(self._optimizer)
        index_of = {}
        for entry in self._keys.values():
            user_index = entry.key if isinstance(entry.key, int) else entry.order
            for _, _, atom_key in entry.atoms:
                index_of[atom_key] = user_index
        opt.param_dict = {a: self._optimizer.param_dict[i] for a, i in index_of.items()
                          if i in self._optimizer.param_dict}
        opt.idx2name = {a: self._optimizer.idx2name[i] for a, i in index_of.items()
                        if i in self._optimizer.idx2name}
        for attr in ("lr_mult", "wd_mult"):
            table = getattr(self._optimizer, attr)
            remapped = {k: v for k, v in table.items() if not isinstance(k, int)}
            remapped.update({a: table[i] for a, i in index_of.items() if i in table})
            setattr(opt, attr, remapped)
        with self._lock:
            self._real.set_optimizer(opt)
        self._optimizer_keys = self._next_atom_key

    # -- steps and the probe ---------------------------------------------------------------------------
    def _close_step(self) -> None:  # holds _cv
        """Close the step being registered. MXNet runs compute asynchronously, so the training loop can
        register the next iteration's first gradients while the engine still runs this one's backward:
        a step is never one iteration's tail and the next one's head (``_continued``), because the
        probe waits for a step's gradients in backward order, and the next iteration's gradients wait
        for the forward that waits for this one's results."""
        if not self._step:
            return
        self._closed_steps.append((self._iteration, self._step))
        self._expected = self._continued | set(self._step_keys)
        self._iteration += 1
        self._step, self._step_keys = [], set()
        self._cv.notify_all()

    def _probe_loop(self) -> None:
        try:
            while True:
                with self._cv:
                    while not self._closed_steps and not self._stopping:
                        if self._step:
                            idle = time.monotonic() - self._last_register
                            if self._blocked:
                                self._cv.wait(self._idle_close_s)
                                continue
                            if idle >= self._idle_close_s:
                                self.steps_closed_idle += 1
                                self._continued |= self._step_keys
                                self._close_step()
                                break
                            self._cv.wait(self._idle_close_s - idle)
                        else:
                            self._cv.wait()
                    if not self._closed_steps:
                        return
                    iteration, syncs = self._closed_steps.popleft()
                untouched = not any(sync.staged.is_set() for sync in syncs)
                if self._mirror:  # followers issue as their gradients are staged (see _stage); they
                    if not self._forward_index:  # learn the forward order all the same: the priority
                        for sync in syncs:  # they give their engine (_announced_atom)
                            self._wait(sync.staged)
                        self._learn_forward_order(syncs, untouched)
                    continue
                for sync in sorted(syncs, key=lambda s: -self._index(s.key)):  # backward order
                    self._wait(sync.staged)  # includes any plain pull of the key (see _pull_one)
                    index = self._index(sync.key)
                    if sync.task.index != index:  # registered before the order was learned
                        task = sync.task
                        sync.task = Task(task.name, index, task.shape, task.itemsize, task.iteration,
                                         payload=sync)
                    with self._lock:
                        self._trace("ready", sync.task.name, iteration)
                        sync.ready = True
                        self.scheduler.post(sync.task)
                        if self.trace is not None:
                            self.trace.plan(self.scheduler, iteration, time.monotonic())
                    self._after_lock()
                with self._lock:
                    self.scheduler.end_of_backward(iteration)
                    self._after_lock()
                self._learn_forward_order(syncs, untouched)
        except BaseException as err:  # surfaced on the next call
            self._fail(err)

    def _index(self, entry: _Key) -> int:
        """The key's task index: its place in the forward pass once learned (keys the learning step
        lacked come after), before that the caller's number."""
        place = self._forward_index.get(entry.key)
        if place is None:
            return entry.caller_index + len(self._forward_index)
        return place

    def _learn_forward_order(self, syncs: list[_Sync], untouched: bool) -> None:
        """Each key's place in the forward pass, the reverse of the order the engine staged ``syncs``,
        learned once from a step none of whose gradients was staged when the probe took it (the first
        step's were all staged at once, after the store's initial waitall, in registration order).
        The next step's tasks are indexed by it, and the scheduler renumbers what it learned per index.
        Gradients of one engine bulk (about a transformer block) are staged together in no set order:
        within a bulk the order is the one seen then, which may differ from worker to worker. So only
        workers that share one order learn it: the leader, which announces its order, and its followers;
        FIFO's workers, each posting on its own, keep the caller's numbering, the same on every worker
        (in 28 runs of tests/mxnet/test_mxnet_byteps.py at 200 Mbit/s, FIFO's workers learning orders of
        their own ended once with parameters unlike ByteScheduler's and Prophet's; cause not found)."""
        if self._forward_index or not untouched or (self._channel is None and self.num_workers > 1):
            return
        before = {entry.key: self._index(entry) for entry in self._keys.values()}
        staged = sorted(syncs, key=lambda s: s.staged.order)
        with self._lock:
            self._forward_index = {sync.key.key: len(staged) - 1 - i for i, sync in enumerate(staged)}
            self.scheduler.renumber({before[key]: self._index(entry) for key, entry in self._keys.items()})

    # -- followers: the leader's order ---------------------------------------------------------------
    def _announced_atom(self, order: int, seq: int, row_start: int, row_end: int, sync: _Sync, rank: int) -> Op:
        """The Synchroniser's follower op for an announced atom of this worker's staged ``sync``."""
        entry = sync.key
        span = entry.atoms_between(row_start, row_end)
        if len(span) != 1 or entry.atoms[span[0]][:2] != (row_start, row_end):
            raise OrderMismatch(f"worker 0 synchronises rows {row_start}:{row_end} of key {entry.key!r} but worker "
                                f"{rank}'s atoms of it are {[a[:2] for a in entry.atoms]} (different models "
                                f"or settings on different workers?)")
        return _atom_op(sync, span[0], sync.task.index)

    # -- the transport the scheduler drives --------------------------------------------------------------
    def send(self, piece: Task) -> None:  # called with _lock held
        self._trace("send", piece.name, piece.iteration, rows=[piece.row_start, piece.row_end])
        sync: _Sync = piece.root.payload
        entry = sync.key
        waiting = 0
        issued = []
        for j in entry.atoms_between(piece.row_start, piece.row_end):
            if sync.state[j] == _DONE:
                continue
            waiting += 1
            sync.waiting[j].append(piece)
            if sync.state[j] == _IDLE:
                sync.state[j] = _SENT
                issued.append(_atom_op(sync, j, piece.index))
        if issued:
            self._sync.submit(*issued)  # issued now (_issue), then announced to the followers
        self._pending[id(piece)] = waiting
        if waiting == 0:
            del self._pending[id(piece)]
            self.scheduler.finished(piece)

    def _issue(self, sync: _Sync, j: int, index: int) -> None:
        entry = sync.key
        atom_key = entry.atoms[j][2]
        sync.state[j] = _SENT
        if self.trace is not None:
            self._issued[id(sync), j] = time.monotonic()
        buf = entry.abufs[j]
        self._transfer(atom_key, buf, -index)
        sync.sent_count += 1
        if self._mirror and sync.sent_count == len(entry.atoms):
            self._sync.forget(sync.seq, entry.order)
        self._notifier.when_free([buf], [], lambda: self._atom_done(sync, j))

    def _transfer(self, atom_key: int, buf: mx.nd.NDArray, priority: int) -> None:
        """Send the atom's rows in ``buf`` and receive the servers' answer into ``buf`` (no wait).

        One ``pushpull`` whose ``out`` is the pushed array itself: MXNet's dist store then issues one
        engine op (one ps-lite request, answered into ``buf``) and skips its copy into ``out``. Atoms
        share no engine variable. Before, pushes sent slices of one staging array and MXNet pulled
        into the array a key last pushed, so every pull wrote that array's variable and a tensor's
        atoms went through the engine one after another, three ops each (push, pull, the pull's
        copy), all in the normal CPU worker's first-in first-out queue behind compute."""
        self._real.pushpull(atom_key, buf, out=buf, priority=priority)

    def _atom_done(self, sync: _Sync, j: int) -> None:  # an engine worker, the atom's result written
        with self._lock:
            if self.trace is not None:
                row_start, row_end, _ = sync.key.atoms[j]
                self.trace.span("atom", f"{sync.task.name} atom {j}", self._issued.pop((id(sync), j)),
                                time.monotonic(), iteration=sync.task.iteration, atom=j, seq=sync.seq,
                                rows=[row_start, row_end])
            sync.state[j] = _DONE
            sync.atoms_done += 1
            if self._mirror and sync.atoms_done == len(sync.key.atoms):
                self._on_done(sync.task)
            pieces, sync.waiting[j] = sync.waiting[j], []
            for piece in pieces:
                self._pending[id(piece)] -= 1
                if self._pending[id(piece)] == 0:
                    del self._pending[id(piece)]
                    self.scheduler.finished(piece)
        self._after_lock()

    def _tick(self) -> None:  # the wakeup timer's thread
        with self._lock:
            self.scheduler.tick()
        self._after_lock()

    def _trace(self, kind: str, name: str, iteration: int, **fields) -> None:
        if self.trace is not None:
            self.trace.instant(kind, name, time.monotonic(), iteration=iteration, **fields)

    def save_trace(self) -> str | None:
        """The trace: the leader's at ``BYTEPS_PROPHET_TRACE``, every other worker's beside it."""
        if self.trace is None:
            return None
        meta = {"framework": "mxnet", "scheduler": self.settings.scheduler, "backend": self.engine_name,
                "rank": self.rank, "world_size": self.num_workers, "leader": self.leader, "mirror": self._mirror,
                "serializations": self.traits.stages,
                "planned_iterations": getattr(self.scheduler, "planned_iterations", None) if self.leader else None,
                "credit_iterations": dict(getattr(self.scheduler, "credit_iterations", {})) if self.leader else None,
                "tensors": [[e.order, str(e.key), list(e.shape), int(np.prod(e.shape)) * np.dtype(e.dtype).itemsize]
                            for e in self._keys.values()]}
        return self.trace.save(trace_path(self.settings.trace, self.rank, primary=self.leader), meta)

    def _on_done(self, task: Task) -> None:  # called with _lock held
        self._trace("done", task.name, task.iteration)
        self._completed.append(task.payload)

    def _after_lock(self) -> None:
        """Copy finished gradients' results into their arrays and open their gates (outside the lock)."""
        with self._lock:
            done, self._completed = self._completed, []
        for sync in done:
            if sync.token is None:
                sync.done.set()
                sync.delivered.set()
                continue

            def deliver(sync=sync):
                entry = sync.key
                try:
                    for out in sync.outs:
                        rows = out.reshape(entry.shape)
                        for (row_start, row_end, _), buf in zip(entry.atoms, entry.abufs):
                            copy_raw(buf, rows[row_start:row_end] if len(entry.atoms) > 1 else rows)
                finally:
                    sync.delivered.set()

            self._gate.release(sync.token, deliver)
            sync.done.set()

    # -- waiting, errors, shutdown -------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> None:
        """Close the current step and wait until everything registered is synchronised."""
        with self._cv:
            self._close_step()
        deadline = None if timeout is None else time.monotonic() + timeout
        for entry in list(self._keys.values()):
            if entry.last is not None:
                self._wait(entry.last.done, deadline)

    def _wait(self, event: threading.Event, deadline: float | None = None) -> None:
        """Wait for ``event``, at most until ``deadline`` (default: BYTEPS_PROPHET_TIMEOUT from now):
        a synchronisation that never finishes ends the run in TimeoutError, not in a hang."""
        if deadline is None:
            deadline = time.monotonic() + self.settings.timeout
        while not event.wait(0.5):
            self._raise_error()
            if time.monotonic() > deadline:
                raise TimeoutError(f"ScheduledKVStore: synchronisation did not finish in time (worker {self.rank}, "
                                   f"{self.settings.scheduler}; BYTEPS_PROPHET_TIMEOUT={self.settings.timeout:g}s)")
        self._raise_error()

    def _fail(self, err: BaseException) -> None:
        if self._error is None:
            self._error = err
            traceback.print_exception(err, file=sys.stderr)

    def _raise_error(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"ScheduledKVStore: background thread failed: {self._error!r}") from self._error

    def close(self) -> None:
        """Wait for everything registered (at most ``BYTEPS_PROPHET_TIMEOUT``, Settings.timeout), then
        stop the store's threads; a synchronisation that never finishes (a peer gone, a bug) ends in
        TimeoutError after the store is shut down, not in a hang. A script that never calls it gets it
        at exit (close_all)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.flush(timeout=self.settings.timeout)
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        self._probe.join(timeout=5)
        if self._timer is not None:
            self._timer.close()
        self._sync.close(timeout=min(10.0, self.settings.timeout))
        self.save_trace()
        if isinstance(self._real, mx.kv.KVStore):
            self._leave_job()

    def _leave_job(self) -> None:
        """Free MXNet's store now: its destructor waits for the engine, meets the other workers and
        leaves ps-lite. Left to interpreter teardown, a worker now and then aborted after its last
        line ("terminate called without an active exception"; 1 in 30 runs of a one-worker job,
        more often with two). Freed through the C API, as the store's own ``__del__`` does, since
        references we cannot see can keep the Python object alive; its handle is cleared so that
        ``__del__`` later frees nothing (freeing a null store is a no-op)."""
        real, self._real = self._real, _LeftStore(self._real)
        handle, real.handle = real.handle, None
        check_call(_LIB.MXKVStoreFree(handle))

    def _entry(self, key) -> _Key:
        try:
            return self._keys[key]
        except KeyError:
            raise UserError(f"ScheduledKVStore: key {key!r} was never initialised (call init first)") from None

    @property
    def atoms(self) -> int:
        return self._next_atom_key

    def stats(self) -> dict:
        """What the benchmark reports next to its timings."""
        sched = self.scheduler
        out = {"atoms": self._next_atom_key, "keys": len(self._keys), "iterations": self._iteration,
               "steps_closed_idle": self.steps_closed_idle, "scheduling_rank": self.leader,
               "bandwidth_Bps": sched.bandwidth.bytes_per_s}
        profiler = getattr(sched, "profiler", None)
        if profiler is not None and profiler.profile is not None:
            out["prophet_blocks"] = len(profiler.profile.blocks)
            out["prophet_profiles_built"] = profiler.profiles_built
        return out


def _atom_op(sync: _Sync, j: int, index: int) -> Op:
    """Atom ``j`` of ``sync`` as the Synchroniser's op: the key's order and which synchronisation of
    it this is (the same on every worker) name it; the atom's rows are its rows."""
    row_start, row_end, _ = sync.key.atoms[j]
    return Op(sync.key.order, sync.seq, row_start, row_end, extra={"sync": sync, "atom": j, "index": index})


class _AtomOps(Backend):
    """The store's atoms as the Synchroniser's backend: ``issue`` hands an atom to the store, and
    MXNet's engine reports its completion (``_atom_done``), so ``issue`` returns no handle."""

    name = "mxnet-store"

    def __init__(self, store: "ScheduledKVStore", channel) -> None:
        super().__init__()
        self.rank, self.size = store.rank, store.num_workers
        self._store, self._channel = store, channel

    def channel(self):
        return self._channel

    def issue(self, op: Op) -> None:
        with self._store._lock:  # re-entered on the leader (the scheduler's send holds it)
            self._store._issue(op.extra["sync"], op.extra["atom"], op.extra["index"])
        return None


class _LeftStore:
    """``ScheduledKVStore._real`` after ``close``: what the store was, nothing left to call (MXNet's
    store was freed: a wrapped store the caller still holds must not be used after ``close`` either)."""

    def __init__(self, real) -> None:
        self.type, self.rank, self.num_workers = real.type, real.rank, real.num_workers

    def __getattr__(self, name):
        raise UserError(f"ScheduledKVStore: {name!r} called after close(); the store has left the job")


def _as_list(value) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _first(value):
    return value[0] if isinstance(value, (list, tuple)) else value


def _pairs(key, value) -> tuple[list, list]:
    """Normalise (key, value) and ([keys], [values]) to two lists of equal length."""
    if isinstance(key, (list, tuple)):
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        if len(values) != len(key):
            raise UserError(f"ScheduledKVStore: {len(key)} keys but {len(values)} values")
        return list(key), values
    return [key], [value]


_LIVE_STORES: "weakref.WeakSet[ScheduledKVStore]" = weakref.WeakSet()


@atexit.register
def close_all() -> None:
    """Close every store its script left open, at interpreter exit and before the interpreter
    finalizes (registered after MXNet's own exit handler, so it runs first): left to finalization,
    the store's threads and MXNet's store aborted both workers of a plain Gluon script
    ("terminate called without an active exception"). After an unhandled exception (Ctrl-C too)
    nothing is waited for: the other workers may be blocked on this one."""
    alone = getattr(sys, "last_value", None) is not None
    for store in list(_LIVE_STORES):
        try:
            if alone:
                store._closed = True
                store._shutdown()
            else:
                store.close()
        except Exception as err:  # noqa: BLE001 - the others must still close
            print(f"byteps-prophet: store not closed cleanly: {err}", file=sys.stderr, flush=True)
