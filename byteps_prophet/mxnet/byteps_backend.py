"""The scheduled store over BytePS's MXNet plugin (``byteps.mxnet``): FIFO, ByteScheduler or Prophet
decide when each atom's ``push_pull`` starts, as on MXNet's own KVStore.

``create_byteps_kvstore()`` calls ``byteps.mxnet.init()`` and returns a :class:`BytePSScheduledKVStore`,
a ``KVStoreBase`` Gluon's ``Trainer(kvstore=...)`` takes as is::

    from byteps_prophet.mxnet.byteps_backend import create_byteps_kvstore
    kv = create_byteps_kvstore()            # BYTEPS_SCHEDULER=fifo|bytescheduler|prophet
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {...}, kvstore=kv)

Everything above the transport is the :class:`~byteps_prophet.mxnet.kvstore.ScheduledKVStore`'s. The
transport differs:

* every atom is its own BytePS tensor, declared and first pushed (BytePS's blocking initialisation
  with every worker) at ``init`` time, in key order on every worker: BytePS numbers tensors by
  declaration order, so the numbers agree;
* an atom is synchronised by ``push_pull`` on its own buffer, in place, summed (what dist_sync does);
* BytePS servers only sum: the optimizer runs on the workers (``is_capable('optimizer')`` is False,
  so the Trainer picks ``update_on_kvstore=False``);
* ``init``/``broadcast`` give rank 0's value to every worker (a summed push_pull where the other
  ranks contribute zeros); ``pull`` gives what the store holds (the initial value, later the last sum).

BytePS itself is :class:`~byteps_prophet.backends.byteps_ps.BytePSTransport` over ``byteps.mxnet``;
``close`` also calls ``byteps.mxnet.shutdown()`` unless the transport was made with ``init=False``.
Do not import ``byteps.torch`` in the same process (docs/BYTEPS.md).
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout

import mxnet as mx

from byteps_prophet.backends.byteps_ps import BytePSTransport
from byteps_prophet.core import Settings
from byteps_prophet.errors import UserError
from byteps_prophet.mxnet.kvstore import ScheduledKVStore

INIT_THREADS = 16  # names initialised at once (each a blocking round trip with every worker)


def create_byteps_kvstore(settings: Settings | None = None, **kwargs) -> "BytePSScheduledKVStore":
    """``byteps.mxnet.init()`` and a scheduled store over it."""
    return BytePSScheduledKVStore(BytePSTransport("mxnet"), settings=settings, **kwargs)


class BytePSScheduledKVStore(ScheduledKVStore):
    """ScheduledKVStore whose atoms are synchronised by ``byteps.mxnet`` push_pull."""

    # Prophet's atom is ByteScheduler's partition: every atom is a BytePS tensor with its own
    # pipeline (docs/DESIGN.md, "ByteScheduler's partition for Prophet's queue on BytePS").
    atoms_per_partition = 1
    engine_name = "byteps"

    def __init__(self, kvstore: BytePSTransport, settings: Settings | None = None, **kwargs) -> None:
        """``kvstore``: ``BytePSTransport("mxnet")``; every worker meets here once (the barrier)."""
        self._init_pool: ThreadPoolExecutor | None = None
        self._init_waiter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bpp-bps-fill")
        kvstore.barrier()
        super().__init__(kvstore, settings=settings, **kwargs)

    @property
    def type(self) -> str:
        return "dist_sync_byteps"  # 'dist': Gluon treats it as a distributed store

    @property
    def num_workers(self) -> int:
        return self._real.size

    def _barrier(self):
        self.flush()
        self._real.barrier()

    @staticmethod
    def is_capable(capability: str) -> bool:
        return False  # servers only sum: the optimizer runs on the workers

    def set_optimizer(self, optimizer) -> None:
        raise UserError("BytePS store: the optimizer runs on the workers; "
                        "use Trainer(..., update_on_kvstore=False) (the default with this store)")

    def save_optimizer_states(self, fname, dump_optimizer=False):
        raise UserError("BytePS store: no optimizer on the servers; save the Trainer's states instead")

    def load_optimizer_states(self, fname):
        raise UserError("BytePS store: no optimizer on the servers; load the Trainer's states instead")

    def _init_atoms(self, entry, value) -> None:
        """Declare the key's atoms now (in key order on every worker: BytePS numbers names by
        declaration order) and initialise them in the background.

        A name's first push_pull initialises it on the servers, a blocking exchange with every worker,
        and broadcasts rank 0's value (the others contribute zeros). These run on ``INIT_THREADS``
        threads in key order on every worker, so the smallest unfinished name is always being
        initialised by every worker (no deadlock) and the atoms overlap their round trips. Pulls of
        the key wait behind an engine gate."""
        real: BytePSTransport = self._real
        bufs, dummies = [], []
        with self._lock:
            for row_start, row_end, atom_key in entry.atoms:
                for name in real.round_names(atom_key):
                    real.declare(name)
                buf = value[row_start:row_end].copy()
                if self.rank != 0:
                    buf[:] = 0
                bufs.append(buf)
                dummies.append(mx.nd.zeros(buf.shape, ctx=buf.context, dtype=buf.dtype))
            if self._init_pool is None:
                self._init_pool = ThreadPoolExecutor(max_workers=INIT_THREADS, thread_name_prefix="bpp-bps-init")
            futures = []
            for (_, _, atom_key), buf, dummy in zip(entry.atoms, bufs, dummies):
                for name, init_buf in zip(real.round_names(atom_key), (buf, dummy)):
                    futures.append(self._init_pool.submit(real.push_pull, name, init_buf, average=False))
            entry.init_futures = futures
            entry.init_bufs = bufs + dummies
        # Rank 0's value: what a pull returns until the first sum. Never a round's buffer: the
        # broadcast's gate may copy it into the parameter after the first round has started
        # (Gluon initialises the store inside the first step, after that step's backward).
        entry.init_values = bufs

    def _init_done(self, entry, deadline=None) -> None:
        for future in getattr(entry, "init_futures", ()):
            while True:
                self._waits.raise_error()
                try:
                    future.result(timeout=0.5)
                    break
                except FuturesTimeout:
                    if deadline is not None and time.monotonic() > deadline:
                        raise TimeoutError("BytePS store: initialisation did not finish in time") from None
        for buf in getattr(entry, "init_bufs", ()):
            buf.wait_to_read()  # the init rounds' pulls are complete on this worker (see _transfer)
        entry.init_futures, entry.init_bufs = [], []

    def _pull_one(self, key, outs: list, priority: int) -> None:
        entry = self._keys[key]
        if entry.last is not None:
            self._waits.wait(entry.last.done)
        if not getattr(entry, "init_futures", None):
            entry.copy_into(outs, entry.init_values if entry.last is None else entry.atom_bufs)
            return
        # Still initialising: hold the outputs with a gate (later readers wait for it, nothing else
        # does) and fill them when the key's first push_pulls are through.
        token = self._gate.hold(outs)
        futures, bufs = entry.init_futures, entry.init_values

        def fill():
            try:
                for future in futures:
                    future.result()
                for buf in bufs:
                    buf.wait_to_read()
            except BaseException as err:  # noqa: BLE001 - surfaced on the next call
                self._waits.fail(err)

            self._gate.release(token, lambda: entry.copy_into(outs, bufs, raw=True))

        self._init_waiter.submit(fill)

    def _register(self, key, values, outs, priority) -> None:
        entry = self._keys[key]
        if getattr(entry, "init_futures", None):
            with self._probe.registering():  # may take seconds: not an idle end of the step
                self._init_done(entry)  # a first scheduled push_pull must not be the name's init
        super()._register(key, values, outs, priority)

    def flush(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        for entry in list(self._keys.values()):
            self._init_done(entry, deadline)
        super().flush(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def _transfer(self, atom_key: int, buf, priority: int) -> None:
        """One round of an atom, summed in place, on the name of its round's parity
        (``BytePSTransport.next_round``: why two names; its first round after the two init rounds
        uses the second name)."""
        self._real.push_pull(self._real.next_round(atom_key), buf, average=False, priority=priority)

    def close(self, alone: bool = False) -> None:
        """As the store's; ``alone`` also leaves BytePS to its own exit handler, which shuts down
        without meeting the other workers (patch 0015)."""
        try:
            super().close(alone)
        finally:
            if self._init_pool is not None:
                self._init_pool.shutdown(wait=not alone)
            self._init_waiter.shutdown(wait=not alone)
            self._real.shutdown(alone=alone)
