"""The readiness probe of an MXNet store: when each gradient is ready, told to the scheduler.

``pushpull`` returns before the gradient exists (MXNet computes asynchronously). Each registered
gradient is *staged*, copied into its atoms' buffers by an engine op on the engine's prioritised
workers, which marks it staged the moment it is written (not behind backward's compute on the normal
CPU worker). Registrations are grouped into *steps*, one iteration's gradients each. A probe thread
takes each closed step, waits for its gradients in backward order, posts each to the scheduler
(stamped in the trace) and ends the step with ``end_of_backward``.

Backward order is the reverse of each key's place in the forward pass (the schedulers' priority),
learned from the order the engine stages one step's gradients: MXNet's Trainer numbers its keys by
sorted parameter name, not in the order the forward pass reads them.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections import deque
import mxnet as mx
import numpy as np

from byteps_prophet.core import Task
from byteps_prophet.mxnet.atoms import AtomSender, KeyAtoms, Synchronisation, trace_instant
from byteps_prophet.mxnet.gates import Notifier, copy_raw
from byteps_prophet.mxnet.waits import BoundedWaits


class Staged(threading.Event):
    """Set once the key's gradient is in its atoms' buffers; ``order`` says when, among all stagings.
    ``sync``: on a follower, the synchronisation it was staged for, once registered."""

    order = -1
    sync: Synchronisation | None = None


class ReadinessProbe:
    """Groups registrations into steps and posts each step's gradients to the scheduler as they are
    staged, in backward order (the leader), or hands each staged gradient to the leader's order (a
    follower). It waits with the store's timeout and hands its failure to the store (``waits``)."""

    def __init__(self, *, lock: threading.RLock, sender: AtomSender, scheduler, keys: dict,
                 notifier: Notifier, waits: BoundedWaits, learns_order: bool, idle_close_s: float) -> None:
        self._lock, self._sender, self._scheduler, self._keys = lock, sender, scheduler, keys
        self._notifier, self._waits = notifier, waits
        self._learns_order = learns_order  # workers that share one order (see _learn_forward_order)
        self._idle_close_s = idle_close_s
        self._stagings = itertools.count()  # the engine's staging order (Staged.order)
        self._forward_index: dict = {}  # key -> its place in the forward pass, learned by the probe
        # Step registration, guarded by _cv.
        self._cv = threading.Condition()
        self.iteration = 0
        self._step: list[Synchronisation] = []
        self._step_keys: set = set()
        self._expected: set | None = None
        # The keys of the steps closed idle since the last step closed otherwise: a step registered
        # after an idle close continues their iteration, until one of them comes again (the next one)
        self._continued: set = set()
        self._last_register = 0.0
        self._closed_steps: deque[tuple[int, list[Synchronisation]]] = deque()
        self.stopping = False
        self.steps_closed_idle = 0
        self._blocked = 0
        self._thread = threading.Thread(target=self._run, name="bpp-mx-probe", daemon=True)
        self._thread.start()

    @property
    def forward_index(self) -> dict:
        """Each key's place in the forward pass (0: read first), learned from the order the engine
        staged the gradients of one step (the reverse); empty until such a step was seen."""
        return dict(self._forward_index)

    def index(self, entry: KeyAtoms) -> int:
        """The key's task index: its place in the forward pass once learned (keys the learning step
        lacked come after), before that the caller's number."""
        place = self._forward_index.get(entry.key)
        if place is None:
            return entry.caller_index + len(self._forward_index)
        return place

    # -- registration (the caller's thread) ------------------------------------------------------------
    def key_comes(self, key) -> None:
        """``key`` is about to be registered: if it was already in this step, a new step began."""
        with self._cv:
            if key in self._step_keys or key in self._continued:
                self._close_step()
                self._continued = set()

    def stage(self, entry: KeyAtoms, grads: list, after_pull: list) -> Staged:
        """Copy the gradient into the atoms' buffers once it is written (and any plain pull of the key
        has landed), then set the returned event. Pushed before the key's gate: with the optimizer on
        the worker the gate holds the gradient itself. A follower's synchronisation is ready to issue
        the leader's atoms as soon as it is staged, not when its step closes: a step closes at the next
        registration, and that may wait for atoms the leader sends only once this worker pushed."""
        staged = Staged()
        row_bytes = int(np.prod(entry.shape[1:], dtype=np.int64)) * np.dtype(entry.dtype).itemsize

        def on_staged():
            if len(grads) == 1:
                for (row_start, _, _), buf in zip(entry.atoms, entry.atom_bufs):
                    copy_raw(grads[0], buf, row_start * row_bytes)
            with self._lock:
                staged.order = next(self._stagings)
                staged.set()
                if self._sender.mirror and staged.sync is not None:
                    self._sender.follower_ready(staged.sync)
            self._sender.deliver_finished()

        if len(grads) > 1:  # one gradient per device: their sum is staged
            whole = len(entry.atoms) == 1
            for (row_start, row_end, _), buf in zip(entry.atoms, entry.atom_bufs):
                mx.nd.add_n(*[g if whole else g[row_start:row_end] for g in grads], out=buf)
            self._notifier.when_free(entry.atom_bufs + after_pull, [], on_staged)
        else:
            self._notifier.when_free([grads[0]] + after_pull, entry.atom_bufs, on_staged)
        return staged

    def register(self, entry: KeyAtoms, outs: list, token: int | None, staged: Staged) -> Synchronisation:
        """The key's synchronisation of this step; the step closes once every key it expects came."""
        with self._cv:
            sync = Synchronisation(entry, outs, token, self.index(entry), self.iteration, staged)
            if self._sender.mirror:
                with self._lock:
                    staged.sync = sync
                    if staged.is_set():
                        self._sender.follower_ready(sync)
            entry.last = sync
            self._step.append(sync)
            self._step_keys.add(entry.key)
            self._last_register = time.monotonic()
            if self._expected is not None and self._step_keys >= self._expected:
                self._close_step()
            self._cv.notify_all()
        return sync

    @contextlib.contextmanager
    def registering(self):
        """A registration waits: the step is not idle meanwhile (the probe must not close it)."""
        with self._cv:
            self._blocked += 1
        try:
            yield
        finally:
            with self._cv:
                self._blocked -= 1
                self._last_register = time.monotonic()

    def close_step(self) -> None:
        with self._cv:
            self._close_step()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cv:
            self.stopping = True
            self._cv.notify_all()
        self._thread.join(timeout=timeout)

    def _close_step(self) -> None:  # holds _cv
        """Close the step being registered. MXNet runs compute asynchronously, so the training loop can
        register the next iteration's first gradients while the engine still runs this one's backward:
        a step is never one iteration's tail and the next one's head (``_continued``), because the
        probe waits for a step's gradients in backward order, and the next iteration's gradients wait
        for the forward that waits for this one's results."""
        if not self._step:
            return
        self._closed_steps.append((self.iteration, self._step))
        self._expected = self._continued | set(self._step_keys)
        self.iteration += 1
        self._step, self._step_keys = [], set()
        self._cv.notify_all()

    # -- the probe thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                closed = self._next_closed_step()
                if closed is None:
                    return
                iteration, syncs = closed
                untouched = not any(sync.staged.is_set() for sync in syncs)
                if self._sender.mirror:  # followers issue as their gradients are staged (see stage);
                    if not self._forward_index:  # they learn the forward order all the same: the
                        for sync in syncs:  # priority they give their engine
                            self._waits.wait(sync.staged)
                        self._learn_forward_order(syncs, untouched)
                    continue
                self._post_step(iteration, syncs)
                self._learn_forward_order(syncs, untouched)
        except BaseException as err:  # surfaced on the next call
            self._waits.fail(err)

    def _next_closed_step(self) -> tuple[int, list[Synchronisation]] | None:
        """The next closed step; a step left idle for ``idle_close_s`` is closed here (unused
        parameters never come). None: stopping."""
        with self._cv:
            while not self._closed_steps and not self.stopping:
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
                return None
            return self._closed_steps.popleft()

    def _post_step(self, iteration: int, syncs: list[Synchronisation]) -> None:
        """The leader: each gradient to the scheduler once staged, in backward order, then the step's end."""
        trace = self._sender.trace
        for sync in sorted(syncs, key=lambda s: -self.index(s.key)):
            self._waits.wait(sync.staged)  # includes any plain pull of the key (the store's pull)
            index = self.index(sync.key)
            if sync.task.index != index:  # registered before the order was learned
                task = sync.task
                sync.task = Task(task.name, index, task.shape, task.itemsize, task.iteration, payload=sync)
            with self._lock:
                trace_instant(trace, "ready", sync.task.name, iteration)
                sync.ready = True
                self._scheduler.post(sync.task)
                if trace is not None:
                    trace.plan(self._scheduler, iteration, time.monotonic())
            self._sender.deliver_finished()
        with self._lock:
            self._scheduler.end_of_backward(iteration)
            self._sender.deliver_finished()

    def _learn_forward_order(self, syncs: list[Synchronisation], untouched: bool) -> None:
        """Each key's place in the forward pass, the reverse of the order the engine staged ``syncs``,
        learned once from a step none of whose gradients was staged when the probe took it (the first
        step's were all staged at once, after the store's initial waitall, in registration order).
        The next step's tasks are indexed by it, and the scheduler renumbers what it learned per index.
        Gradients of one engine bulk (about a transformer block) are staged together in no set order:
        within a bulk the order is the one seen then, which may differ from worker to worker. So only
        workers that share one order learn it: the leader, which announces its order, and its
        followers; FIFO's workers, each posting on its own, keep the caller's numbering, the same on
        every worker."""
        if self._forward_index or not untouched or not self._learns_order:
            return
        before = {entry.key: self.index(entry) for entry in self._keys.values()}
        staged = sorted(syncs, key=lambda s: s.staged.order)
        with self._lock:
            self._forward_index = {sync.key.key: len(staged) - 1 - i for i, sync in enumerate(staged)}
            self._scheduler.renumber({before[key]: self.index(entry) for key, entry in self._keys.items()})
