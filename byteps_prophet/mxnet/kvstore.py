"""A scheduled KVStore for MXNet 1.9: FIFO, ByteScheduler or Prophet decide when each slice moves.

``ScheduledKVStore(mx.kv.create('dist_sync'))`` (or :func:`create`) is a ``KVStoreBase``, so Gluon's
``Trainer(kvstore=kv)`` and ``Module.fit(kvstore=kv)`` take it as is. It intercepts ``push``,
``pull`` and ``pushpull`` (Trainer and Module call ``pushpull`` in 1.9; a wrapper that only hooks
push/pull is bypassed).

Per ``pushpull(key, grad, out=weight)``, in the caller's thread and without waiting: the gradient is
staged into its atoms' buffers by an engine op (:mod:`.readiness`), an engine gate is pushed that
holds ``out`` (:mod:`.gates`: the next forward of this layer, and only of this layer, waits for it),
and the key's synchronisation joins the current step. The readiness probe posts each staged gradient
to the scheduler; the scheduler sends slices, sent as fixed atoms (:mod:`.atoms`); when every atom
of a key is back, its result is copied into ``out`` under the gate and the gate opens.

One worker, the leader, schedules; the others issue the leader's atoms in its order
(docs/DESIGN.md, "Followers follow the leader's order"). Values are exactly those of the unscheduled
store: each row is summed once per iteration by the server, and with ``update_on_kvstore`` the
server's optimizer runs per atom with the parameter's own lr/wd multipliers.
"""
from __future__ import annotations

import atexit
import sys
import threading
import time
import weakref
from typing import Any

import mxnet as mx
import numpy as np
from mxnet.base import _LIB, check_call
from mxnet.kvstore import KVStoreBase

from byteps_prophet.backends.base import close_each
from byteps_prophet.backends.channel import SocketChannel, order_channel
from byteps_prophet.backends.rendezvous import rendezvous
from byteps_prophet.backends.wakeup import install_wakeup_timer
from byteps_prophet.core import EngineTraits, MonotonicClock, Settings, make_scheduler
from byteps_prophet.core.link_monitor import link_monitor
from byteps_prophet.core.trace import TraceLog, trace_path, writable
from byteps_prophet.errors import UserError
from byteps_prophet.mxnet.atoms import AtomSender, KeyAtoms, KeyTable, atom_elements, optimizer_for_atoms
from byteps_prophet.mxnet.gates import EngineGate, Notifier
from byteps_prophet.mxnet.readiness import ReadinessProbe
from byteps_prophet.mxnet.waits import BoundedWaits

IDLE_CLOSE_S = 0.1  # no pushpull for this long closes the step (unused parameters never come)


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


def _order_channel(settings: Settings, store_type: str, leader: bool, workers: int) -> SocketChannel | None:
    """Worker 0 announces its order to the others over a socket at ``MASTER_ADDR:MASTER_PORT``;
    FIFO needs no order, and without ``MASTER_ADDR`` the followers send each gradient when it is
    ready (said once, by the leader)."""
    if settings.scheduler == "fifo" or "dist" not in store_type or workers < 2:
        return None
    channel = order_channel(leader, workers - 1)
    if channel is None and leader:
        sys.stderr.write("byteps_prophet: no MASTER_ADDR (worker 0's address): the other workers send "
                         "each gradient when it is ready, not in the scheduler's order\n")
    return channel


class ScheduledKVStore(KVStoreBase):
    """The KVStore API over a real store (``_real``); the atoms (:class:`AtomSender`) are the
    scheduler's transport and the :class:`ReadinessProbe` posts the gradients to the scheduler.

    Longer than 250 lines: it is the whole ``KVStoreBase`` surface MXNet calls (init, broadcast, pull, push,
    pushpull, the optimizer's four, barrier) and the store's lifecycle (flush, close, stats, trace);
    the work behind each call is in atoms.py and readiness.py."""

    # Prophet's default atom: ByteScheduler's partition cut in this many (docs/DESIGN.md, "Fixed atoms").
    atoms_per_partition = 4
    engine_name = "kvstore"

    def __init__(self, kvstore, settings: Settings | None = None, *, clock=None,
                 idle_close_s: float = IDLE_CLOSE_S) -> None:
        self.settings = Settings.from_env() if settings is None else settings
        self._real = kvstore
        self._keys = KeyTable(self.settings, atom_elements(self.settings, per_partition=self.atoms_per_partition))
        self._lock = threading.RLock()  # the scheduler and every call into the real store
        self._waits = BoundedWaits(self.settings.timeout, f"worker {self.rank}, {self.settings.scheduler}")
        self.leader = is_leader(self)  # self: a subclass may say what its transport is
        if self.settings.trace:  # before any thread or socket starts
            writable(trace_path(self.settings.trace, self.rank, primary=self.leader))
        self._channel = _order_channel(self.settings, self.type, self.leader, self.num_workers)
        mirror = self._channel is not None and not self.leader
        local = self.settings if self.leader else self.settings.replace(scheduler="fifo")
        # A push then a pull cross the link (pulls follow pushes: the values come in the push's
        # reply), and Prophet's slices finer than an atom only cost sends.
        self.traits = EngineTraits(name=self.engine_name, stages=2, pulls_follow_pushes=True,
                                   atom_elements=self._keys.atom_elements if local.scheduler == "prophet" else 0)
        monitor = link_monitor(self.settings, self.traits.stages) if self.leader else None
        self._gate = EngineGate()
        self._optimizer = None
        self._optimizer_keys = -1  # how many atoms the optimizer sent to the servers knows
        # Staged gradients and finished atoms are reported by engine ops on the prioritised workers.
        notifier = Notifier(self._waits.fail)
        # BYTEPS_PROPHET_TRACE=PATH: written at close by the leader to PATH, by every other worker beside it.
        self.trace = TraceLog(self.rank, f"worker {self.rank}") if self.settings.trace else None
        self._atoms = AtomSender(traits=self.traits, lock=self._lock, rank=self.rank, size=self.num_workers,
                                 channel=self._channel, mirror=mirror, gate=self._gate, notifier=notifier,
                                 trace=self.trace, on_error=self._waits.fail, transfer=self._transfer)
        self.scheduler = make_scheduler(local, MonotonicClock() if clock is None else clock, self._atoms,
                                        self._atoms.on_done, monitor=monitor)
        self._atoms.scheduler = self.scheduler
        self._timer = install_wakeup_timer(self.scheduler, self._tick, self._waits.fail) if self.leader else None
        learns_order = self._channel is not None or self.num_workers <= 1
        self._probe = ReadinessProbe(lock=self._lock, sender=self._atoms, scheduler=self.scheduler,
                                     keys=self._keys, notifier=notifier, waits=self._waits,
                                     learns_order=learns_order, idle_close_s=idle_close_s)
        self._closed = False
        _LIVE_STORES.add(self)

    @property
    def forward_index(self) -> dict:
        """Each key's place in the forward pass (0: read first), learned by the readiness probe."""
        return self._probe.forward_index

    # -- KVStoreBase surface -------------------------------------------------------------------------
    type = property(lambda self: self._real.type, doc="The real store's type (dist_sync, ...).")
    rank = property(lambda self: self._real.rank, doc="This worker's rank in the real store.")
    num_workers = property(lambda self: self._real.num_workers, doc="Workers of the real store.")

    @staticmethod
    def is_capable(capability: str) -> bool:
        return capability.lower() == KVStoreBase.OPTIMIZER

    def set_optimizer(self, optimizer) -> None:
        """Kept and sent on the first push, re-keyed from user keys to atom keys."""
        self._optimizer = optimizer
        self._optimizer_keys = -1
        if "dist" not in self.type:
            self._real.set_optimizer(optimizer)
            self._optimizer_keys = self._keys.atom_count

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
        shape = tuple(value.shape) or (1,)
        entry = self._keys.cut(key, shape, value.dtype)
        self._init_atoms(entry, value.reshape(shape))
        self._keys[key] = entry

    def _init_atoms(self, entry: KeyAtoms, value: mx.nd.NDArray) -> None:
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
        pushed, so a pull served later returns a gradient sum, and MXNet orders nothing between the
        two (docs/MXNET.md, "Known MXNet 1.9.1 pitfalls"). So the next push of the key waits until
        these buffers are written (``KeyAtoms.pulled``)."""
        entry = self._keys[key]
        if entry.last is not None:
            self._waits.wait(entry.last.delivered)  # MXNet pulls into the buffer the last pushpull answered in
        if not outs:
            return
        if not entry.pull_bufs:
            entry.pull_bufs = entry.buffers(outs[0].context)
        with self._lock:
            for (_, _, atom_key), buf in zip(entry.atoms, entry.pull_bufs):
                self._real.pull(atom_key, out=buf, priority=priority)
        entry.copy_into(outs, entry.pull_bufs)
        entry.pulled = entry.pull_bufs

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
        self._waits.raise_error()
        if self._atoms.closed_by_leader:
            raise RuntimeError("ScheduledKVStore: worker 0 closed the order channel (it finished or left)")
        entry = self._keys[key]
        self._probe.key_comes(key)
        if entry.last is not None and not entry.last.delivered.is_set():
            with self._probe.registering():
                self._waits.wait(entry.last.delivered)  # the atom buffers still hold its rows or its result
        self._send_optimizer()
        if not entry.atom_bufs:
            entry.atom_bufs = entry.buffers(values[0].context)
        after_pull, entry.pulled = entry.pulled, []
        staged = self._probe.stage(entry, [v.reshape(entry.shape) for v in values], after_pull)
        token = self._gate.hold(outs) if outs else None
        entry.caller_index = -priority if priority < 0 else (key if isinstance(key, int) and key >= 0 else entry.order)
        self._probe.register(entry, outs, token, staged)

    def _send_optimizer(self) -> None:
        if self._optimizer is None or self._optimizer_keys == self._keys.atom_count or "dist" not in self.type:
            return
        self.flush()  # re-sending resets server-side state; never with a step in flight
        opt = optimizer_for_atoms(self._optimizer, list(self._keys.values()))
        with self._lock:
            self._real.set_optimizer(opt)
        self._optimizer_keys = self._keys.atom_count

    def _transfer(self, atom_key: int, buf: mx.nd.NDArray, priority: int) -> None:
        """Send the atom's rows in ``buf`` and receive the servers' answer into ``buf`` (no wait): one
        ``pushpull`` whose ``out`` is the pushed array itself, so MXNet's dist store issues one engine
        op (one ps-lite request, answered into ``buf``) and no copy into another array."""
        self._real.pushpull(atom_key, buf, out=buf, priority=priority)

    def _tick(self) -> None:  # the wakeup timer's thread
        with self._lock:
            self.scheduler.tick()
        self._atoms.deliver_finished()

    # -- waiting, errors, shutdown -------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> None:
        """Close the current step and wait until everything registered is synchronised."""
        self._probe.close_step()
        deadline = None if timeout is None else time.monotonic() + timeout
        for entry in list(self._keys.values()):
            if entry.last is not None:
                self._waits.wait(entry.last.done, deadline)

    def close(self, alone: bool = False) -> None:
        """Wait for everything registered (at most ``BYTEPS_PROPHET_TIMEOUT``), then stop the store's
        threads and leave the job; a synchronisation that never finishes ends in TimeoutError after
        the store is shut down, not in a hang. A script that never calls it gets it at exit.

        ``alone``: the process is leaving on an error while the other workers may be blocked on it:
        wait for nothing and meet no peer (the order channel closes with the process; the engine gates
        open without their results; MXNet's store is abandoned, since freeing it meets every worker in
        a barrier), so that the process exits with its error and its launcher names it."""
        if self._closed:
            return
        self._closed = True
        try:
            if not alone:
                self.flush(timeout=self.settings.timeout)
        finally:
            self._shutdown(alone)

    def _shutdown(self, alone: bool) -> None:
        self._probe.stop(timeout=0 if alone else 5)
        if self._timer is not None:
            self._timer.close()
        if alone:
            with self._lock:
                self._atoms.stop()
            self._gate.open_all()
        else:
            self._atoms.close(timeout=min(10.0, self.settings.timeout))
        self.save_trace()
        if isinstance(self._real, mx.kv.KVStore):
            self._real = _abandon(self._real) if alone else _leave_job(self._real)

    # -- what it did ---------------------------------------------------------------------------------
    @property
    def atoms(self) -> int:
        return self._keys.atom_count

    def stats(self) -> dict:
        """What the benchmark reports next to its timings."""
        sched = self.scheduler
        out = {"atoms": self._keys.atom_count, "keys": len(self._keys), "iterations": self._probe.iteration,
               "steps_closed_idle": self._probe.steps_closed_idle, "scheduling_rank": self.leader,
               "bandwidth_Bps": sched.bandwidth.bytes_per_s}
        profiler = getattr(sched, "profiler", None)
        if profiler is not None and profiler.profile is not None:
            out["prophet_blocks"] = len(profiler.profile.blocks)
            out["prophet_profiles_built"] = profiler.profiles_built
        return out

    def save_trace(self) -> str | None:
        """The trace: the leader's at ``BYTEPS_PROPHET_TRACE``, every other worker's beside it."""
        if self.trace is None:
            return None
        leader = self.leader
        meta = {"framework": "mxnet", "scheduler": self.settings.scheduler, "backend": self.engine_name,
                "rank": self.rank, "world_size": self.num_workers, "leader": leader, "mirror": self._atoms.mirror,
                "serializations": self.traits.stages,
                "planned_iterations": getattr(self.scheduler, "planned_iterations", None) if leader else None,
                "credit_iterations": dict(getattr(self.scheduler, "credit_iterations", {})) if leader else None,
                "tensors": [[e.order, str(e.key), list(e.shape), int(np.prod(e.shape)) * np.dtype(e.dtype).itemsize]
                            for e in self._keys.values()]}
        return self.trace.save(trace_path(self.settings.trace, self.rank, primary=leader), meta)


def _leave_job(real: mx.kv.KVStore) -> "_LeftStore":
    """Free MXNet's store now: its destructor waits for the engine, meets the other workers and
    leaves ps-lite, and left to interpreter teardown it can abort the worker. Freed through the C
    API, as the store's own ``__del__`` does, since references we cannot see can keep the Python
    object alive; its handle is cleared so that ``__del__`` later frees nothing."""
    left = _LeftStore(real)
    handle, real.handle = real.handle, None
    check_call(_LIB.MXKVStoreFree(handle))
    return left


def _abandon(real: mx.kv.KVStore) -> "_LeftStore":
    """Never free MXNet's store (its destructor would meet the other workers): its handle is
    cleared, so that its ``__del__`` frees nothing."""
    left = _LeftStore(real)
    real.handle = None
    return left


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
    the store's threads and MXNet's store can abort the workers. After an unhandled exception
    (Ctrl-C too; Python sets ``sys.last_value`` before the exit handlers) each closes alone."""
    close_each(_LIVE_STORES, "store")
