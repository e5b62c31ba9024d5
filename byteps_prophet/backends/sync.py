"""The Synchroniser: issues every rank's ops in one global order and reports completions.

Rank 0 (the leader) receives ops from its scheduler (``submit``, called under the plugin's lock, never
blocks), announces each batch on the order channel, then issues them. Every other rank (a follower)
reads the announcements in order, waits until its own copy of that gradient is ready, checks that it
has the same rows, and issues the same op. So all ranks issue the same collectives, cut at the same
rows, in the same order, whatever their local timing.

Two threads per rank: the *issuer* (announce/read, then ``backend.issue``) and the *waiter*
(``backend.wait`` in issue order, then ``on_finished(op)``). Any failure (a collective error, a lost
peer, a mismatch) goes to ``on_error`` once and stops both threads; callers waiting on the plugin are
woken and raise it. Nothing waits without a bound on the failure of another party.

The same class serves both frameworks (framework-free): the torch plugin submits ops to the issuer
thread (``submit`` never blocks its caller); a store that must issue at once, under its own lock, as
the MXNet stores do, passes ``inline=True`` and ``submit`` issues and announces in the caller's thread.
A backend whose ``issue`` returns ``None`` reports completion itself (MXNet's engine does); the waiter
waits only for the handles it gets. ``make_op`` turns an announced record and the follower's local
object into the op it issues (default: those rows of the local 2-D tensor); ``forget`` drops a local
entry once its every op was issued, where no end-of-iteration record does.

Mismatches detected (each an :class:`OrderMismatch` naming the gradient and iteration):
* rank 0 synchronises a gradient this rank finished its backward pass without producing;
* this rank produced a gradient rank 0 never synchronised in that iteration (rank 0 sends an
  end-of-iteration record once all of its gradients for an iteration are done);
* the announced rows do not exist in this rank's gradient (different shapes).
"""
from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import defaultdict, deque
from typing import Callable

from byteps_prophet.backends.base import Backend, BackendError, FusedOp, Op, OrderMismatch


def slice_rows(name, iteration: int, row_start: int, row_end: int, tensor, rank: int) -> Op:
    """The follower's op for an announced record: those rows of its own 2-D ``tensor``."""
    if row_end > tensor.shape[0]:
        raise OrderMismatch(
            f"rank 0 synchronises rows {row_start}:{row_end} of {name!r} but rank {rank}'s gradient "
            f"has {tensor.shape[0]} rows (different models on different ranks?)")
    return Op(name, iteration, row_start, row_end, tensor[row_start:row_end], whole=tensor)


class Synchroniser:
    def __init__(self, backend: Backend, on_finished: Callable[[Op], None],
                 on_error: Callable[[BaseException], None], *, leader: bool | None = None,
                 inline: bool = False, make_op: Callable[..., Op] = slice_rows) -> None:
        self.backend = backend
        self.on_finished = on_finished
        self.on_error = on_error
        self.leader = backend.rank == 0 if leader is None else leader
        self.channel = backend.channel() if backend.size > 1 else None
        self._inline = inline
        self._make_op = make_op
        self._inline_lock = threading.Lock()  # inline leader: one announcement at a time, in issue order
        self.closed_by_leader = False  # follower: the leader closed its channel (it finished)
        self._cond = threading.Condition()
        self._outbox: deque = deque()  # leader: records to announce and issue
        self._waits: queue.Queue = queue.Queue()
        # follower bookkeeping, per iteration
        self._local: dict[tuple[int, str], object] = {}
        self._posted: dict[int, set[str]] = defaultdict(set)
        self._announced: dict[int, set[str]] = defaultdict(set)
        self._ended: set[int] = set()
        self._failed: BaseException | None = None
        self._closing = False
        self._seq = 0
        self._issuer = None
        if not (self.leader and inline):
            target = self._lead if self.leader else self._follow
            self._issuer = threading.Thread(target=self._guard(target), name="bpp-issuer", daemon=True)
            self._issuer.start()
        self._waiter = threading.Thread(target=self._guard(self._wait_loop), name="bpp-waiter", daemon=True)
        self._waiter.start()

    # -- leader side ---------------------------------------------------------------------------------
    def submit(self, *ops: Op) -> None:
        """Leader: synchronise ``ops`` in this order (after everything submitted before). Inline:
        issued now, in the caller's thread, then announced as one record; a failure goes to
        ``on_error`` (the caller does not see it raised)."""
        if not self._inline:
            with self._cond:
                self._outbox.extend(("op", op) for op in ops)
                self._cond.notify_all()
            return
        try:
            with self._inline_lock:
                if self._failed is not None:
                    return
                for op in ops:
                    self._issue(op)
                if self.channel is not None:
                    self.channel.put([["op", *op.describe()] for op in ops])
        except BaseException as err:  # noqa: BLE001 - reaches the training loop through on_error
            self._fail(err)

    def end_iteration(self, iteration: int) -> None:
        """Leader: every gradient of ``iteration`` is synchronised; followers check theirs."""
        if self.channel is None:
            return
        with self._cond:
            self._outbox.append(("end", iteration))
            self._cond.notify_all()

    def _lead(self) -> None:
        while True:
            with self._cond:
                while not self._outbox and not self._closing and self._failed is None:
                    self._cond.wait()
                if self._failed is not None:
                    return
                batch = list(self._outbox)
                self._outbox.clear()
                closing = self._closing and not batch
            if closing:
                if self.channel is not None:
                    self.channel.put([["close"]])
                self._waits.put(None)
                return
            if self.channel is not None:
                records = []
                for kind, item in batch:
                    records.append(["op", *item.describe()] if kind == "op" else ["end", item])
                self.channel.put(records)
            for kind, item in batch:
                if kind == "op":
                    self._issue(item)

    # -- follower side --------------------------------------------------------------------------------
    def local_ready(self, iteration: int, name: str, tensor2d) -> None:
        with self._cond:
            self._local[(iteration, name)] = tensor2d
            self._posted[iteration].add(name)
            self._cond.notify_all()

    def forget(self, iteration: int, name) -> None:
        """Follower: every op of this local entry was issued; drop it (no end record will)."""
        with self._cond:
            self._local.pop((iteration, name), None)
            for names in (self._posted, self._announced):
                names.get(iteration, set()).discard(name)
                if not names.get(iteration, True):
                    del names[iteration]

    def local_end_of_backward(self, iteration: int) -> None:
        with self._cond:
            self._ended.add(iteration)
            self._cond.notify_all()

    def _follow(self) -> None:
        rank = self.backend.rank
        while True:
            records = self.channel.get()
            for record in records:
                kind = record[0]
                if kind == "close":
                    self.closed_by_leader = True
                    self._waits.put(None)
                    return
                if kind == "end":
                    self._check_end(int(record[1]), rank)
                    continue
                _, name, iteration, row_start, row_end, *fused = record
                if fused:  # a fused op (backends.base.FusedOp): its members, in the leader's order
                    members = [self._local_op(m, iteration, a, b, rank) for m, a, b in fused[0]]
                    op = None if None in members else FusedOp.of(members)
                else:
                    op = self._local_op(name, iteration, row_start, row_end, rank)
                if op is None:
                    return
                self._issue(op)

    def _local_op(self, name, iteration: int, row_start: int, row_end: int, rank: int) -> Op | None:
        """This rank's op for announced rows, once its gradient is ready (None: the run failed)."""
        with self._cond:
            while (iteration, name) not in self._local and self._failed is None:
                if iteration in self._ended:
                    raise OrderMismatch(
                        f"rank 0 synchronises gradient {name!r} of iteration {iteration}, but rank {rank} "
                        f"finished that backward pass without it (parameter unused on rank {rank} only?)")
                self._cond.wait(1.0)
            if self._failed is not None:
                return None
            local = self._local[(iteration, name)]
            self._announced[iteration].add(name)
        return self._make_op(name, iteration, row_start, row_end, local, rank)

    def _check_end(self, iteration: int, rank: int) -> None:
        with self._cond:
            while iteration not in self._ended and self._failed is None and not self._closing:
                self._cond.wait(1.0)
            missing = self._posted.pop(iteration, set()) - self._announced.pop(iteration, set())
            self._ended.discard(iteration)
            for key in [k for k in self._local if k[0] == iteration]:
                del self._local[key]
        if missing:
            raise OrderMismatch(
                f"gradient {sorted(missing)[0]!r} became ready on rank {rank} in iteration {iteration} but rank 0 "
                f"never synchronised it ({len(missing)} such; parameters used on some ranks only?)")

    # -- both -----------------------------------------------------------------------------------------
    def _issue(self, op: Op) -> None:
        op.extra["issue"] = time.monotonic()
        op.seq = self._seq
        self._seq += 1
        handle = self.backend.issue(op)
        if handle is not None:  # None: the backend reports completion itself
            self._waits.put((op, handle))

    def _wait_loop(self) -> None:
        while True:
            item = self._waits.get()
            if item is None or self._failed is not None:
                return
            op, handle = item
            self.backend.wait(handle)
            self.on_finished(op)

    def _guard(self, fn):
        def run():
            try:
                fn()
            except BaseException as err:  # noqa: BLE001 - every failure must reach the training loop
                self._fail(err)
        return run

    def _fail(self, err: BaseException) -> None:
        with self._cond:
            if self._failed is not None:
                return
            if not isinstance(err, BackendError):
                err = BackendError(f"rank {self.backend.rank}: {type(err).__name__}: {err}")
            self._failed = err
            self._cond.notify_all()
        self._waits.put(None)
        if self.channel is not None:
            self.channel.close()  # wakes a reader blocked on it; the peers see the channel go
        self.on_error(err)

    @property
    def failed(self) -> BaseException | None:
        return self._failed

    def close(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self.leader and self._issuer is None:  # inline: the close record from here, best effort
            # not while an issue never returns (it holds the lock): closing must not hang with it
            if self._inline_lock.acquire(timeout=timeout):
                try:
                    if self.channel is not None and self._failed is None:
                        with contextlib.suppress(BackendError):  # a follower that left first
                            self.channel.put([["close"]])
                finally:
                    self._inline_lock.release()
            self._waits.put(None)
            self._waiter.join(timeout)
        elif self.leader:
            self._issuer.join(timeout)
            self._waiter.join(timeout)
        else:
            # a follower waits for rank 0's close record, but never longer than the timeout
            self._issuer.join(timeout)
            if self.channel is not None:
                self.channel.close()
            self._waits.put(None)
            self._waiter.join(timeout)
        if self.leader and self.channel is not None:
            self.channel.close()
        self.channel = None  # its store is the backend's to release (torch_dist.py, close)
