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

Mismatches detected (each an :class:`OrderMismatch` naming the gradient and iteration):
* rank 0 synchronises a gradient this rank finished its backward pass without producing;
* this rank produced a gradient rank 0 never synchronised in that iteration (rank 0 sends an
  end-of-iteration record once all of its gradients for an iteration are done);
* the announced rows do not exist in this rank's gradient (different shapes).
"""
from __future__ import annotations

import queue
import threading
import time
from collections import defaultdict, deque
from typing import Callable

from byteps_prophet.backends.base import Backend, BackendError, FusedOp, Op, OrderMismatch


class Synchroniser:
    def __init__(self, backend: Backend, on_finished: Callable[[Op], None],
                 on_error: Callable[[BaseException], None]) -> None:
        self.backend = backend
        self.on_finished = on_finished
        self.on_error = on_error
        self.leader = backend.rank == 0
        self.channel = backend.channel() if backend.size > 1 else None
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
        target = self._lead if self.leader else self._follow
        self._issuer = threading.Thread(target=self._guard(target), name="bpp-issuer", daemon=True)
        self._waiter = threading.Thread(target=self._guard(self._wait_loop), name="bpp-waiter", daemon=True)
        self._issuer.start()
        self._waiter.start()

    # -- leader side ---------------------------------------------------------------------------------
    def submit(self, op: Op) -> None:
        with self._cond:
            self._outbox.append(("op", op))
            self._cond.notify_all()

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

    def _local_op(self, name: str, iteration: int, row_start: int, row_end: int, rank: int) -> Op | None:
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
            tensor = self._local[(iteration, name)]
            self._announced[iteration].add(name)
        if row_end > tensor.shape[0]:
            raise OrderMismatch(
                f"rank 0 synchronises rows {row_start}:{row_end} of {name!r} but rank {rank}'s gradient "
                f"has {tensor.shape[0]} rows (different models on different ranks?)")
        return Op(name, iteration, row_start, row_end, tensor[row_start:row_end], whole=tensor)

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
            self.channel.closed.set()
        self.on_error(err)

    @property
    def failed(self) -> BaseException | None:
        return self._failed

    def close(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self.leader:
            self._issuer.join(timeout)
            self._waiter.join(timeout)
        else:
            # a follower waits for rank 0's close record, but never longer than the timeout
            self._issuer.join(timeout)
            if self.channel is not None:
                self.channel.closed.set()
            self._waits.put(None)
            self._waiter.join(timeout)
