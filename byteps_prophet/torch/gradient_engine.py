"""The gradient engine behind one DistributedOptimizer: hooks -> scheduler -> backend -> update.

1. **Timing probe.** A post-accumulate-grad hook on every parameter fires when its gradient is ready
   (after the last of ``backward_passes_per_step`` passes) and posts a :class:`~byteps_prophet.core.Task`
   to the scheduler. An autograd end-of-pass callback ends the backward pass, so no block ever waits
   for a gradient that does not come (unused or frozen parameters).
2. **Scheduled synchronisation.** Rank 0's scheduler starts slices (``send``, the scheduler's
   Transport); the :class:`~byteps_prophet.backends.sync.Synchroniser` has every rank issue them in
   the leader's order; the backend synchronises them in place.
3. **Update.** Each synchronised gradient goes to the :class:`UpdateLedger`, which applies or holds
   its update (torch/parameter_updates.py).
4. **Overlap** (opt-in): a global forward pre-hook (:class:`ForwardGate`) makes each module's
   forward wait for its own parameters' updates only.

Profile recording and tracing are listeners on the engine's events (torch/listeners.py). Failures
on any thread are raised in the training thread at the next hook, forward, ``step()`` or
``synchronize()``. Scheduler calls are serialised by ``lock``; update flags by the ledger's ``cond``.
"""
from __future__ import annotations

import threading
import weakref

import torch

from byteps_prophet.backends.base import Backend, BackendError, FusedOp, Op
from byteps_prophet.backends.sync import Synchroniser
from byteps_prophet.backends.wakeup import install_wakeup_timer
from byteps_prophet.core import MonotonicClock, Settings, Task, make_scheduler
from byteps_prophet.core.link_monitor import link_monitor
from byteps_prophet.core.task import Fused
from byteps_prophet.errors import ConfigError
from byteps_prophet.torch.listeners import EngineListener, listeners_for
from byteps_prophet.torch.parameter_updates import ParameterState, UpdateLedger, make_twin
from byteps_prophet.torch.prophet_pieces import prophet_atom_elements, prophet_settings


class GradientEngine:
    def __init__(self, opt: torch.optim.Optimizer, base_cls: type, named: list[tuple[str, torch.nn.Parameter]],
                 compression, bpps: int, settings: Settings, backend: Backend, *, model_name: str = "model",
                 batch_size: int = 1) -> None:
        self.base_cls, self.compression, self.bpps, self.backend = base_cls, compression, bpps, backend
        self.layerwise = settings.layerwise
        self.overlap = settings.overlap and settings.layerwise
        self.leader = backend.rank == 0
        self.lock = threading.Lock()  # the scheduler's lock
        self.clock = MonotonicClock()
        self.iteration = 0
        self.closed = False
        self._passes = 0  # backward passes in this iteration
        self._callback_queued = False
        self._backward_ended = False
        self._posted_this_iteration = False
        self._outstanding: dict[int, int] = {}  # leader: gradients not yet synchronised, per iteration
        self._ends_sent: set[int] = set()
        self._done: list[ParameterState] = []  # leader: synchronised by the scheduler call in progress

        self.params, self.by_id, self.by_name = self._track(opt, named)
        self.updates = UpdateLedger(self.params, base_cls, compression, self.layerwise)
        self.settings = settings = prophet_settings(settings, backend.traits.pulls_follow_pushes)
        # The Transport contract, read by the scheduler as it is made: the backend's engine, with the
        # atoms it sends under Prophet (every rank: all must send the same atoms).
        atom = backend.use_atoms(prophet_atom_elements(settings)) if settings.scheduler == "prophet" else 0
        self.traits = backend.traits.replace(atom_elements=atom)
        self.accepts_fused = backend.accepts_fused  # Prophet's fused collectives go out as one FusedOp
        self.listeners: list[EngineListener] = listeners_for(self, model_name, batch_size)  # before any thread
        self.scheduler = self._timer = None
        if self.leader:
            self.scheduler = make_scheduler(settings, self.clock, self, self._on_done,
                                            monitor=link_monitor(settings, self.traits.stages))
            self._timer = install_wakeup_timer(self.scheduler, self._tick, self.updates.fail)
        self.sync = Synchroniser(backend, self._on_op_finished, self.updates.fail)
        self._hooks = [entry.param.register_post_accumulate_grad_hook(self._make_hook(entry))
                       for entry in self.params]
        self._hooks += ForwardGate(self).install()

    def _track(self, opt, named):
        """Every trainable parameter, once, in ``named``'s order: the list, by id and by name."""
        group_of = {id(p): g for g in opt.param_groups for p in g["params"]}
        params: list[ParameterState] = []
        by_id: dict[int, ParameterState] = {}
        by_name: dict[str, ParameterState] = {}
        for name, p in named:
            if not p.requires_grad or id(p) in by_id:
                continue
            if id(p) not in group_of:
                raise ConfigError(f"named_parameters: {name!r} is not in the optimizer's parameter groups; "
                                  f"valid: parameters the optimizer was built with")
            if name in by_name:
                raise ConfigError(f"named_parameters: duplicate name {name!r}; valid: unique names")
            group = group_of[id(p)]
            entry = ParameterState(name, len(params), p, group, make_twin(opt, self.base_cls, group, p))
            params.append(entry)
            by_id[id(p)] = by_name[name] = entry
        return params, by_id, by_name

    # -- hooks (training thread) ---------------------------------------------------------------------
    def _make_hook(self, entry: ParameterState):
        engine_ref = weakref.ref(self)

        def hook(param):
            engine = engine_ref()
            if engine is not None and not engine.closed:
                engine._gradient_ready(entry)
        return hook

    def _gradient_ready(self, entry: ParameterState) -> None:
        self.updates.raise_if_failed()
        if not self._callback_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_pass_done)
            self._callback_queued = True
        if self._passes + 1 < self.bpps:
            return  # accumulate locally; synchronise after the last pass
        self._post(entry)

    def _post(self, entry: ParameterState) -> None:
        if entry.posted_iteration == self.iteration:
            return
        if entry.pending:
            self.updates.wait_for([entry])  # the previous update must land before a new gradient is sent
        now = self.clock.now()
        grad = entry.param.grad
        if grad is None:
            return
        entry.posted_iteration = self.iteration
        self._posted_this_iteration = True
        wire, entry.ctx = self.compression.compress(grad)
        if not wire.is_contiguous():
            wire = wire.contiguous()
        rows = wire.shape[0] if wire.dim() > 0 else 1
        entry.payload = wire.reshape(rows, -1)
        entry.rows_left = rows
        self.updates.begin(entry)
        for listener in self.listeners:
            listener.on_gradient_ready(entry, now, wire.numel() * wire.element_size())
        with self.lock:
            self._outstanding[self.iteration] = self._outstanding.get(self.iteration, 0) + 1
            if self.leader:
                self.scheduler.post(Task(entry.name, entry.index, tuple(wire.shape) or (1,), wire.element_size(),
                                         self.iteration, payload=entry))
                for listener in self.listeners:
                    listener.on_posted(self.iteration, now)
        if not self.leader:
            self.sync.local_ready(self.iteration, entry.name, entry.payload)

    def _backward_pass_done(self) -> None:
        self._callback_queued = False
        self._passes += 1
        if self._passes >= self.bpps:
            self._end_backward()

    def _end_backward(self) -> None:
        if self._backward_ended:
            return
        iteration = self.iteration
        now = self.clock.now()
        for listener in self.listeners:
            listener.on_end_of_backward(iteration, now)
        with self.lock:
            self._backward_ended = True
            if self.leader:
                self.scheduler.end_of_backward(iteration)
                self._maybe_end_iteration(iteration)
        if not self.leader:
            self.sync.local_end_of_backward(iteration)

    # -- the leader's bookkeeping and the Transport contract (under lock) ------------------------------
    def _maybe_end_iteration(self, iteration: int) -> None:
        """Leader: once backward is over and every gradient is done, tell the followers."""
        if iteration in self._ends_sent:
            return
        if self._outstanding.get(iteration, 0) == 0 and (iteration < self.iteration or self._backward_ended):
            self._outstanding.pop(iteration, None)
            self._ends_sent.add(iteration)
            self._ends_sent.discard(iteration - 8)
            self.sync.end_iteration(iteration)

    def send(self, piece: Task | Fused) -> None:
        if type(piece) is Fused:
            op = FusedOp.of([self._op(member) for member in piece.members], piece=piece)
        else:
            op = self._op(piece)
        now = self.clock.now()
        for listener in self.listeners:
            listener.on_op_submitted(op, now)
        self.sync.submit(op)

    @staticmethod
    def _op(piece: Task) -> Op:
        entry: ParameterState = piece.root.payload
        return Op(piece.name, piece.iteration, piece.row_start, piece.row_end,
                  entry.payload[piece.row_start:piece.row_end], piece=piece, whole=entry.payload)

    def _on_done(self, task: Task) -> None:
        self._done.append(task.root.payload)
        self._outstanding[task.iteration] -= 1
        if task.iteration < self.iteration or self._backward_ended:
            self._maybe_end_iteration(task.iteration)

    def _tick(self) -> None:  # the wakeup timer's thread: a tick only sends, nothing completes
        with self.lock:
            if not self.closed:
                self.scheduler.tick()

    # -- completions (waiter thread) -------------------------------------------------------------------
    def _on_op_finished(self, op: Op) -> None:
        now = self.clock.now()
        if self.leader:
            with self.lock:
                self.scheduler.finished(op.piece)
                done, self._done = self._done, []
                for listener in self.listeners:
                    listener.on_op_finished(op, now)
        else:
            for listener in self.listeners:
                listener.on_op_finished(op, now)
            done = []
            for member in op.members if isinstance(op, FusedOp) else (op,):
                entry = self.by_name[member.name]
                entry.rows_left -= member.row_end - member.row_start
                if entry.rows_left == 0:
                    done.append(entry)
                if entry.rows_left < 0:
                    raise BackendError(f"rank {self.backend.rank}: rows of {member.name!r} synchronised twice")
        for entry in done:
            self.updates.synchronised(entry)

    # -- step and close (training thread) ------------------------------------------------------------
    def finish_backward(self, stepping: bool = True) -> None:
        """Make sure this iteration's gradients are all posted and its backward pass is closed.
        ``step()`` before the last accumulation pass, or with no backward pass since the last step
        (``broadcast_optimizer_state`` initialises the state so), synchronises every gradient there is,
        as stock BytePS's does; ``synchronize()`` with nothing new since the last step has nothing to do."""
        self.updates.raise_if_failed()
        if 0 < self._passes < self.bpps or (stepping and not self._passes):
            for entry in self.params:
                if entry.param.grad is not None:
                    self._post(entry)
        if self._posted_this_iteration:
            self._end_backward()

    def step_done(self) -> None:
        now = self.clock.now()
        for listener in self.listeners:
            listener.on_step(self.iteration, now)
        self.iteration += 1
        self._posted_this_iteration = False
        self._passes = 0
        self._backward_ended = False
        with self.lock:
            if self.leader:
                for it in [it for it in self._outstanding if it < self.iteration]:
                    self._maybe_end_iteration(it)

    def close(self, alone: bool = False) -> None:
        """Let the updates land, end the threads, tell the listeners (trace, profile), leave the job.
        ``alone``: the process is leaving on an error, while the other ranks may wait for it: wait for
        nothing, and leave the order channel to close with the process, so that the others learn of
        the failure as its launcher does, when the process is gone, and the launcher names this rank,
        not the first peer to notice."""
        if self.closed:
            return
        try:
            if self.updates.error is None and not alone:
                self.updates.wait_all()
        finally:
            self.closed = True
            for h in self._hooks:
                h.remove()
            if self._timer is not None:
                self._timer.close()
            if not alone:
                self.sync.close()
            try:
                for listener in self.listeners:
                    listener.on_close()
            finally:
                self.backend.close(together=self.updates.error is None and not alone)

    def listener(self, kind: type) -> EngineListener | None:
        """The listener of class ``kind``, if the settings asked for one."""
        return next((lst for lst in self.listeners if isinstance(lst, kind)), None)


class ForwardGate:
    """The global forward hooks: a module's forward waits for the coming updates of its own
    parameters (under overlap, the last step's), raises a failure of another thread, and tells the
    listeners when it starts, waits and ends."""

    def __init__(self, engine: GradientEngine) -> None:
        self.engine = engine

    def install(self) -> list:
        """Register the hooks; their handles, for ``remove()``."""
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        hooks = [register_module_forward_pre_hook(self.pre_forward)]
        if any(type(lst).on_forward_end is not EngineListener.on_forward_end for lst in self.engine.listeners):
            hooks.append(register_module_forward_hook(self.post_forward))
        return hooks

    def pre_forward(self, module, args):
        engine = self.engine
        if engine.closed:
            return None
        for listener in engine.listeners:
            listener.on_forward_pre(module, engine.clock.now())
        updates, by_id = engine.updates, engine.by_id
        if updates.pending_count:
            waiting = [by_id[id(p)] for p in module._parameters.values() if p is not None and id(p) in by_id]
            if waiting:
                with updates.cond:
                    blocked = any(updates.coming(e) for e in waiting)
                start = engine.clock.now()
                updates.wait_for(waiting)
                end = engine.clock.now()
                for listener in engine.listeners:
                    listener.on_forward_wait(waiting[0], start, end, blocked)
        else:
            updates.raise_if_failed()
        for listener in engine.listeners:
            listener.on_forward_start(module, engine.clock.now())
        return None

    def post_forward(self, module, args, output):
        now = self.engine.clock.now()
        for listener in self.engine.listeners:
            listener.on_forward_end(module, now)
        return None
