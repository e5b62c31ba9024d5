"""The PyTorch plugin: timing probe, scheduled synchronisation, layer-wise update and overlap.

``DistributedOptimizer(optimizer, named_parameters, compression, backward_passes_per_step)`` takes the
same arguments as ``byteps.torch.DistributedOptimizer`` and returns an object of a subclass of the
optimizer's own class that shares its parameter groups and state. Per iteration:

1. **Timing probe.** A post-accumulate-grad hook on every parameter fires when its gradient is ready
   (after the last of ``backward_passes_per_step`` passes), stamps it, records it in the profile (when
   one is asked for) and posts a :class:`~byteps_prophet.core.Task` to the scheduler
   (``BYTEPS_SCHEDULER``). An autograd end-of-pass callback calls ``end_of_backward``, so no block
   ever waits for a gradient that does not come (unused or frozen parameters).
2. **Scheduled synchronisation.** The scheduler (rank 0's; the other ranks follow its announced order,
   see :mod:`byteps_prophet.backends.sync`) starts slices; the backend synchronises them in place.
3. **Layer-wise update.** Once ``step()`` is called, each parameter whose gradient is synchronised is
   stepped alone by the user's optimizer class (a shallow twin holding one parameter and sharing state
   and hyper-parameters, re-read at each step so LR schedulers work): those already synchronised at
   once, the others on the completion thread as they arrive. ``step()`` returns when every parameter is
   updated, as stock BytePS's does, so a script sees the same parameters wherever it looks
   (docs/DESIGN.md, "Stock step() semantics by default"). ``synchronize()`` waits for the averaged
   gradients only, so the clipping idiom (``synchronize()``, clip, ``step()`` in
   ``skip_synchronize()``) works as with BytePS.
4. **Layer-wise overlap** (opt-in, ``BYTEPS_PROPHET_OVERLAP=1``). ``step()`` returns at once; a global
   forward pre-hook makes each module's next forward wait only for its own parameters' updates, and
   ``state_dict()``, ``synchronize()`` and ``close()`` wait for all. Parameters read any other way
   (directly, or outside their module's forward) may then be one update behind. ``zero_grad()``
   defers the zeroing of a parameter whose update is still pending to just after that update.

Failures on any thread (a dead peer, an order mismatch) are raised in the training thread at the
next hook, forward, ``step()`` or ``synchronize()``.

Configuration comes from ``Settings`` (read once from the environment; README "Settings"): besides the
scheduler's, ``BYTEPS_PROPHET_BACKEND`` (gloo|nccl|byteps|local), ``BYTEPS_PROPHET_PROFILE`` (write
the recorded profile there; ``{rank}`` is replaced, otherwise only rank 0 writes),
``BYTEPS_PROPHET_TRACE``, ``BYTEPS_PROPHET_OVERLAP=1`` (layer-wise overlap, above),
``BYTEPS_PROPHET_LAYERWISE=0`` (no per-parameter update: ``step()`` waits for synchronisation, then
steps the whole optimizer at once).
"""
from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import weakref
from typing import Any, Iterable

import torch

from byteps_prophet.backends import Backend, make_backend
from byteps_prophet.backends.base import BackendError, FusedOp, Op
from byteps_prophet.core.link_monitor import link_monitor
from byteps_prophet.backends.sync import Synchroniser
from byteps_prophet.backends.rendezvous import rendezvous
from byteps_prophet.backends.wakeup import install_wakeup_timer
from byteps_prophet.core import MonotonicClock, Settings, Task, make_scheduler
from byteps_prophet.core.task import Fused
from byteps_prophet.core.trace import TraceLog, trace_path, writable
from byteps_prophet.errors import ConfigError, UserError
from byteps_prophet.torch.compression import Compression

_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
                torch.float64: "float64"}
WAIT_SLICE = 1.0  # seconds between checks for a failure while waiting


def default_backend_name(settings: Settings | None = None) -> str:
    """``BYTEPS_PROPHET_BACKEND`` (``settings.backend``), else what the process is: an initialised
    torch.distributed group's, a BytePS worker's, gloo for several ranks, local for one."""
    name = (Settings.from_env() if settings is None else settings).backend
    if name:
        return name
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return "nccl" if dist.get_backend() == "nccl" else "gloo"
    where = rendezvous()
    if where.role == "worker":
        return "byteps"
    if where.world_size > 1:
        return "gloo"
    return "local"


PROPHET_PARTITION = 4_000_000  # elements: Prophet's pieces in the queue; its own cuts size what is sent


def _prophet_settings(settings: Settings, pulls_follow_pushes: bool = False) -> Settings:
    """Prophet cuts pieces to its predictions itself; ByteScheduler's 1 M-element partition only adds
    messages, and on the real engines every message pays a start-up latency (docs/history/AB-notebook.md). So, unless
    a partition is set (``BYTESCHEDULER_PARTITION``, which makes ``Settings.prophet_partition`` 0, or a
    non-default ``Settings.partition``), Prophet queues pieces of ``BYTEPS_PROPHET_PARTITION``
    (``Settings.prophet_partition``) elements (0 keeps the ByteScheduler partition):
    by default 4 M, ByteScheduler's default credit, on all-reduce; where pulls follow pushes (BytePS)
    0, since every chunk there is at most 2 MiB anyway and a step the link keeps up with goes under
    ByteScheduler's credit, where 4 M pieces kept one piece in flight (resnet b32 1 Gbit/s: Prophet
    0.864x of FIFO with them, docs/history/AB-notebook.md section 24)."""
    from byteps_prophet.core.settings import DEFAULT_PARTITION

    if settings.scheduler != "prophet" or settings.partition != DEFAULT_PARTITION:
        return settings
    value = settings.prophet_partition
    if value < 0:  # unset: derived from the engine
        value = 0 if pulls_follow_pushes else PROPHET_PARTITION
    return settings.replace(partition=value) if value else settings


def _prophet_atom_elements(settings: Settings) -> int:
    """Elements per fixed atom where the backend needs stable slices (``Backend.use_atoms``):
    ``BYTEPS_PROPHET_ATOM_ELEMENTS``, default a quarter of ByteScheduler's default partition (250 k, as
    the MXNet store's atoms, docs/MXNET.md). On a parameter server a piece's pull follows its
    push, so the step ends a few pieces' pushes and pulls after the last byte is ready: finer atoms
    shorten that tail. vgg 200 Mbit/s, Prophet/BS: 250 k 1.065x, 500 k 1.021x, 1 M 0.974x; the
    compute-bound resnet showed no difference beyond its noise (docs/history/AB-notebook.md section 11)."""
    from byteps_prophet.core.settings import DEFAULT_PARTITION

    return settings.atom_elements or DEFAULT_PARTITION // 4


class _Param:
    __slots__ = ("name", "index", "param", "group", "twin", "pending", "synced", "zero_after", "payload", "ctx",
                 "rows_left", "posted_iteration")

    def __init__(self, name, index, param, group, twin):
        self.name, self.index, self.param, self.group, self.twin = name, index, param, group, twin
        self.pending = False  # synchronisation or update outstanding
        self.synced = False  # synchronised, its update held for its step() (step() applies it)
        self.zero_after: bool | None = None  # zero_grad(set_to_none) deferred until after the update
        self.payload = None  # the 2-D tensor on the wire
        self.ctx = None  # compression context
        self.rows_left = 0  # follower bookkeeping
        self.posted_iteration = -1


class _Engine:
    """Everything behind one DistributedOptimizer. Scheduler calls are serialised by ``lock``."""

    def __init__(self, opt: torch.optim.Optimizer, base_cls: type, named: list[tuple[str, torch.nn.Parameter]],
                 compression, bpps: int, settings: Settings, backend: Backend, profile_path: str | None,
                 model_name: str, batch_size: int, overlap: bool, layerwise: bool) -> None:
        self.opt, self.base_cls = opt, base_cls
        self.compression = compression
        self.bpps = bpps
        self.settings = settings
        self.backend = backend
        self.overlap = overlap and layerwise
        self.layerwise = layerwise
        self.lock = threading.Lock()  # the scheduler's lock
        self.cond = threading.Condition()  # update state (pending flags, errors)
        self.error: BaseException | None = None
        self.clock = MonotonicClock()
        self.iteration = 0
        self._stepped = -1  # the last iteration whose step() was called: its updates apply as they come
        self._held_count = 0  # entries synced and held for their step()
        self._passes = 0
        self._callback_queued = False
        self._backward_ended = False
        self._outstanding: dict[int, int] = {}
        self._posted_this_iteration = False
        self._ends_sent: set[int] = set()
        self._pending_count = 0
        self.closed = False
        # BYTEPS_PROPHET_TRACE=PATH: every rank logs its events with their times (docs/PYTORCH.md)
        self._trace_path = settings.trace or None
        self.trace: TraceLog | None = None
        if self._trace_path:
            writable(trace_path(self._trace_path, backend.rank, primary=backend.rank == 0))
            self.trace = TraceLog(backend.rank, f"rank {backend.rank}")
        if profile_path and ("{rank}" in profile_path or backend.rank == 0):  # checked before any thread starts
            writable(profile_path.replace("{rank}", str(backend.rank)), "BYTEPS_PROPHET_PROFILE")

        group_of = {id(p): g for g in opt.param_groups for p in g["params"]}
        self.params: list[_Param] = []
        self.by_id: dict[int, _Param] = {}
        self.by_name: dict[str, _Param] = {}
        for name, p in named:
            if not p.requires_grad or id(p) in self.by_id:
                continue
            if id(p) not in group_of:
                raise ConfigError(f"named_parameters: {name!r} is not in the optimizer's parameter groups; "
                                  f"valid: parameters the optimizer was built with")
            if name in self.by_name:
                raise ConfigError(f"named_parameters: duplicate name {name!r}; valid: unique names")
            entry = _Param(name, len(self.params), p, group_of[id(p)], self._twin(opt, group_of[id(p)], p))
            self.params.append(entry)
            self.by_id[id(p)] = entry
            self.by_name[name] = entry

        self.leader = backend.rank == 0
        settings = self.settings = _prophet_settings(settings, backend.traits.pulls_follow_pushes)
        # The Transport contract, read by the scheduler as it is made: the backend's engine, with the
        # atoms it sends under Prophet (every rank: all must send the same atoms).
        atom = backend.use_atoms(_prophet_atom_elements(settings)) if settings.scheduler == "prophet" else 0
        self.traits = backend.traits.replace(atom_elements=atom)
        self.accepts_fused = backend.accepts_fused  # Prophet's fused collectives go out as one FusedOp
        self.scheduler = None
        self._timer = None
        if self.leader:
            self.scheduler = make_scheduler(settings, self.clock, self, self._on_done,
                                            monitor=link_monitor(settings, self.traits.stages))
            self._timer = install_wakeup_timer(self.scheduler, self._tick, self._on_error)
        self._done: list[_Param] = []
        self.sync = Synchroniser(backend, self._on_op_finished, self._on_error)

        self._hooks = [entry.param.register_post_accumulate_grad_hook(self._make_hook(entry))
                       for entry in self.params]
        self._recorder = None
        self._profile_path = profile_path
        self._fwd_stack: list[list] = []
        self._unattributed = 0.0
        self._iter_open = False
        self._last_forward_end = None
        if profile_path:
            from byteps_prophet.profile import ProfileRecorder

            tensors = [(e.name, tuple(e.param.shape) or (1,), _DTYPE_NAMES.get(e.param.dtype, "float32"))
                       for e in self.params]
            self._recorder = ProfileRecorder(tensors, model=model_name, framework="pytorch", batch=batch_size,
                                             device=str(self.params[0].param.device) if self.params else "cpu",
                                             world_size=backend.size, warmup=2,
                                             meta={"scheduler": settings.scheduler, "backend": backend.name,
                                                   "rank": backend.rank, "fuse": settings.fuse})
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        self._global_hooks = [register_module_forward_pre_hook(self._pre_forward)]
        if self._recorder is not None:
            self._global_hooks.append(register_module_forward_hook(self._post_forward))

    # -- the per-parameter twin optimizer ------------------------------------------------------------
    def _twin(self, opt, group, p):
        twin = object.__new__(self.base_cls)
        twin.__dict__.update(opt.__dict__)
        twin.param_groups = [dict(group, params=[p])]
        return twin

    # -- hooks (training thread) ---------------------------------------------------------------------
    def _make_hook(self, entry: _Param):
        engine_ref = weakref.ref(self)

        def hook(param):
            engine = engine_ref()
            if engine is not None and not engine.closed:
                engine._gradient_ready(entry)
        return hook

    def _gradient_ready(self, entry: _Param) -> None:
        self.raise_if_failed()
        if not self._callback_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_pass_done)
            self._callback_queued = True
        if self._passes + 1 < self.bpps:
            return  # accumulate locally; synchronise after the last pass
        self._post(entry)

    def _post(self, entry: _Param) -> None:
        if entry.posted_iteration == self.iteration:
            return
        if entry.pending:
            self._wait_for([entry])  # the previous update must land before a new gradient is sent
        now = self.clock.now()
        grad = entry.param.grad
        if grad is None:
            return
        entry.posted_iteration = self.iteration
        self._posted_this_iteration = True
        wire, ctx = self.compression.compress(grad)
        if not wire.is_contiguous():
            wire = wire.contiguous()
        rows = wire.shape[0] if wire.dim() > 0 else 1
        entry.payload = wire.reshape(rows, -1)
        entry.ctx = ctx
        entry.rows_left = rows
        with self.cond:
            entry.pending = True
            self._pending_count += 1
        if self._recorder is not None:
            self._ensure_iteration_open(now)
            if not self._bwd_marked:
                start = self._last_forward_end if self._last_forward_end is not None else now
                self._recorder.backward_start(max(start, self._iter_begin))
                self._bwd_start, self._bwd_marked = max(start, self._iter_begin), True
            self._recorder.gradient_ready(entry.name, max(now, self._bwd_start))
        if self.trace is not None:
            self.trace.instant("ready", entry.name, now, iteration=self.iteration, index=entry.index,
                               bytes=wire.numel() * wire.element_size())
        with self.lock:
            self._outstanding[self.iteration] = self._outstanding.get(self.iteration, 0) + 1
            if self.leader:
                self.scheduler.post(Task(entry.name, entry.index, tuple(wire.shape) or (1,), wire.element_size(),
                                         self.iteration, payload=entry))
                if self.trace is not None:
                    self.trace.plan(self.scheduler, self.iteration, now)
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
        if self.trace is not None:
            self.trace.instant("eob", "end of backward", self.clock.now(), iteration=iteration)
        with self.lock:
            self._backward_ended = True
            if self.leader:
                self.scheduler.end_of_backward(iteration)
                self._maybe_end_iteration(iteration)
        if not self.leader:
            self.sync.local_end_of_backward(iteration)

    def _maybe_end_iteration(self, iteration: int) -> None:
        """Leader, under lock: once backward is over and every gradient is done, tell the followers."""
        if iteration in self._ends_sent:
            return
        if self._outstanding.get(iteration, 0) == 0 and (iteration < self.iteration or self._backward_ended):
            self._outstanding.pop(iteration, None)
            self._ends_sent.add(iteration)
            self._ends_sent.discard(iteration - 8)
            self.sync.end_iteration(iteration)

    # -- the Transport contract (called by the scheduler, under lock) ---------------------------------
    def send(self, piece: Task | Fused) -> None:
        if type(piece) is Fused:
            op = FusedOp.of([self._op(member) for member in piece.members], piece=piece)
        else:
            op = self._op(piece)
        if self.trace is not None:
            op.extra["submit"] = self.clock.now()
        self.sync.submit(op)

    @staticmethod
    def _op(piece: Task) -> Op:
        entry: _Param = piece.root.payload
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
        if self.leader:
            with self.lock:
                if self.trace is not None:
                    now = self.clock.now()
                self.scheduler.finished(op.piece)
                done, self._done = self._done, []
                if self.trace is not None:  # a fused op: one line per member, with the op's times
                    bw = self.scheduler.bandwidth  # (the cost the scheduler reads: a fused collective's, if it fuses)
                    cost = bw.rate_and_cost(getattr(self.scheduler, "fuses", False))[1]
                    for member in op.members if isinstance(op, FusedOp) else (op,):
                        self._trace_op(op, member, member.piece.index, member.piece.nbytes, now, op.extra.get("submit"),
                                       bandwidth_Bps=bw.bytes_per_s, message_cost_s=cost,
                                       latency_s=bw.latency)
        else:
            done = []
            for member in op.members if isinstance(op, FusedOp) else (op,):
                entry = self.by_name[member.name]
                if self.trace is not None:  # the leader's fields; the scheduler's are rank 0's
                    self._trace_op(op, member, entry.index, member.tensor.numel() * member.tensor.element_size(),
                                   self.clock.now(), None)
                entry.rows_left -= member.row_end - member.row_start
                if entry.rows_left == 0:
                    done.append(entry)
                if entry.rows_left < 0:
                    raise BackendError(f"rank {self.backend.rank}: rows of {member.name!r} synchronised twice")
        for entry in done:
            self._synchronised(entry)

    def _trace_op(self, op: Op, member: Op, index: int, nbytes: int, done: float, submit: float | None,
                  **leader) -> None:
        """One op's ``member`` (the op itself unless fused) as a span from the op's submission to the
        scheduler's transport (the leader) or its issue to the engine (a follower) to its completion."""
        issue = op.extra.get("issue")
        start = submit if submit is not None else issue if issue is not None else done
        self.trace.span("op", member.name, start, done, iteration=op.iteration, index=index,
                        rows=[member.row_start, member.row_end], bytes=nbytes,
                        submit_ts=None if submit is None else round(submit * 1e6, 3),
                        issue_ts=None if issue is None else round(issue * 1e6, 3), **leader)

    def _synchronised(self, entry: _Param) -> None:
        """Completion thread: the gradient is averaged. Its update applies now if its step() was called;
        else step() applies it, so that between synchronize() and step() the user sees (and may clip)
        the averaged gradient, as with stock BytePS."""
        p = entry.param
        if entry.ctx is not None or entry.payload.data_ptr() != (p.grad.data_ptr() if p.grad is not None else -1):
            restored = self.compression.decompress(entry.payload.reshape(p.grad.shape), entry.ctx)
            p.grad.copy_(restored)
        entry.payload = entry.ctx = None
        with self.cond:
            apply_now = not self.layerwise or entry.posted_iteration <= self._stepped
            if not apply_now:
                entry.synced = True
                self._held_count += 1
                self.cond.notify_all()
        if apply_now:
            self._apply(entry)

    def _apply(self, entry: _Param) -> None:
        """Step this parameter alone (layer-wise), then mark it done. Exactly one thread calls it per
        update: the completion thread, or step() for updates synchronised before it was called."""
        if self.layerwise:
            twin_group = entry.twin.param_groups[0]
            for key, value in entry.group.items():
                if key != "params":
                    twin_group[key] = value
            self.base_cls.step(entry.twin)
        with self.cond:
            if entry.zero_after is not None:
                _zero(entry.param, entry.zero_after)
                entry.zero_after = None
            entry.pending = False
            self._pending_count -= 1
            self.cond.notify_all()

    def apply_synchronised(self) -> None:
        """step(): this iteration's updates apply from now on; those already synchronised apply here."""
        with self.cond:
            self._stepped = self.iteration
            ready = [e for e in self.params if e.synced] if self._held_count else []
            for entry in ready:
                entry.synced = False
            self._held_count = 0
        for entry in ready:
            self._apply(entry)

    @staticmethod
    def _outstanding_update(entry: _Param) -> bool:
        """Under cond: an update that will land without the user doing anything more (one synchronised
        and held for its step() does not)."""
        return entry.pending and not entry.synced

    def _on_error(self, err: BaseException) -> None:
        with self.cond:
            if self.error is None:
                self.error = err
            self.cond.notify_all()

    # -- waiting -------------------------------------------------------------------------------------------
    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise BackendError(str(self.error))

    def _wait_for(self, entries: Iterable[_Param]) -> None:
        entries = list(entries)
        with self.cond:
            while True:
                if self.error is not None:
                    raise BackendError(str(self.error))
                if not any(self._outstanding_update(e) for e in entries):
                    return
                self.cond.wait(WAIT_SLICE)

    def wait_all(self) -> None:
        """Until every update that is coming has landed (not those held for their step())."""
        with self.cond:
            while self.error is None and self._pending_count > self._held_count:
                self.cond.wait(WAIT_SLICE)
        self.raise_if_failed()

    def _pre_forward(self, module, args):
        if self._recorder is not None and not self.closed:
            now = self.clock.now()
            if self._iteration_end_pending:
                self._close_profile_iteration(now)
                self._iteration_end_pending = False
            self._ensure_iteration_open(now)
        if self._pending_count and not self.closed:
            waiting = [self.by_id[id(p)] for p in module._parameters.values()
                       if p is not None and id(p) in self.by_id]
            if waiting:
                with self.cond:
                    blocked = any(self._outstanding_update(e) for e in waiting)
                t0 = self.clock.now()
                self._wait_for(waiting)
                waited = self.clock.now() - t0
                if self._fwd_stack:
                    # the wait falls in the enclosing module's span: not its compute either (else a
                    # container's waits reach the profile as the next layer's forward time)
                    self._fwd_stack[-1][2] += waited
                if self.trace is not None and blocked:
                    self.trace.span("wait", f"forward waits for {waiting[0].name}", t0, t0 + waited,
                                    track="training", iteration=self.iteration, index=waiting[0].index)
        elif self.error is not None and not self.closed:
            self.raise_if_failed()
        if self._recorder is not None and not self.closed:
            # started after any wait: waiting for an update is not forward compute
            self._fwd_stack.append([module, self.clock.now(), 0.0])
        return None

    def _post_forward(self, module, args, output):
        if not self._fwd_stack:
            return None
        now = self.clock.now()
        mod, start, children = self._fwd_stack.pop()
        duration = now - start
        if self._fwd_stack:
            self._fwd_stack[-1][2] += duration
        else:
            self._last_forward_end = now
        exclusive = max(0.0, duration - children) + self._unattributed
        first = next((self.by_id[id(p)] for p in mod._parameters.values()
                      if p is not None and id(p) in self.by_id), None)
        if first is None:
            self._unattributed = exclusive
        else:
            self._unattributed = 0.0
            if self._iter_open:
                self._recorder.forward_time(first.name, exclusive)
        return None

    # -- profile ------------------------------------------------------------------------------------------
    _bwd_start = 0.0
    _iter_begin = 0.0
    _bwd_marked = False
    _iteration_end_pending = False

    def _ensure_iteration_open(self, now: float) -> None:
        if self._iter_open:
            return
        self._recorder.begin_iteration(now)
        self._fwd_stack.clear()
        self._unattributed = 0.0
        self._bwd_start = self._iter_begin = now
        self._bwd_marked = False
        self._last_forward_end = None
        self._iter_open = True

    def _close_profile_iteration(self, now: float) -> None:
        if self._recorder is None or not self._iter_open:
            return
        bandwidth = None
        if self.scheduler is not None and self.scheduler.bandwidth.known:
            bandwidth = self.scheduler.bandwidth.bytes_per_s
        self._recorder.end_iteration(now, bandwidth_Bps=bandwidth)
        self._iter_open = False

    def save_profile(self, path: str | None = None) -> str | None:
        path = path or self._profile_path
        if self._recorder is None or not path or self._recorder.iterations_recorded == 0:
            return None
        if "{rank}" in path:
            path = path.replace("{rank}", str(self.backend.rank))
        elif self.backend.rank != 0:
            return None
        self._recorder.profile().save(path)
        return path

    def save_trace(self) -> str | None:
        """The trace (docs/PYTORCH.md, "Trace"): rank 0 at ``BYTEPS_PROPHET_TRACE``, the others beside it."""
        if self.trace is None or not self._trace_path:
            return None
        rank = self.backend.rank
        path = trace_path(self._trace_path, rank, primary=rank == 0)
        meta = {"framework": "pytorch", "rank": rank, "scheduler": self.settings.scheduler, "backend": self.backend.name, "world_size": self.backend.size,
                "serializations": self.traits.stages,
                # iterations Prophet's prediction scheduled (not its fallback, the credit): leader only
                "planned_iterations": getattr(self.scheduler, "planned_iterations", None),
                "credit_iterations": dict(getattr(self.scheduler, "credit_iterations", {})),
                "tensors": [[e.index, e.name, list(e.param.shape), e.param.numel() * e.param.element_size()]
                            for e in self.params]}
        return self.trace.save(path, meta)

    # -- step -----------------------------------------------------------------------------------------------
    def finish_backward(self, stepping: bool = True) -> None:
        """Make sure this iteration's gradients are all posted and its backward pass is closed.
        ``step()`` before the last accumulation pass, or with no backward pass since the last step
        (``broadcast_optimizer_state`` initialises the state so), synchronises every gradient there is,
        as stock BytePS's does; ``synchronize()`` with nothing new since the last step has nothing to do."""
        self.raise_if_failed()
        if 0 < self._passes < self.bpps or (stepping and not self._passes):
            for entry in self.params:
                if entry.param.grad is not None:
                    self._post(entry)
        if self._posted_this_iteration:
            self._end_backward()

    def step_done(self) -> None:
        if self.trace is not None:
            self.trace.instant("step", "step", self.clock.now(), iteration=self.iteration)
        if self._recorder is not None and self._iter_open:
            self._iteration_end_pending = True
        self.iteration += 1
        self._posted_this_iteration = False
        self._passes = 0
        self._backward_ended = False
        with self.lock:
            if self.leader:
                for it in [it for it in self._outstanding if it < self.iteration]:
                    self._maybe_end_iteration(it)

    def close(self, alone: bool = False) -> None:
        """Let the updates land, end the threads, write the trace and profile. ``alone``: the process
        is leaving on an error, while the other ranks may wait for it: wait for nothing, and leave the
        order channel to close with the process, so that the others learn of the failure as its
        launcher does, when the process is gone, and the launcher names this rank, not the first
        peer to notice."""
        if self.closed:
            return
        try:
            if self.error is None and not alone:
                self.wait_all()
        finally:
            self.closed = True
            for h in self._hooks + self._global_hooks:
                h.remove()
            if self._timer is not None:
                self._timer.close()
            if not alone:
                self.sync.close()
            self.save_trace()
            try:
                self.save_profile()
            except UserError as err:  # a profile problem must not fail the training job
                print(f"byteps-prophet: profile not written: {err}", file=sys.stderr, flush=True)
            finally:
                self.backend.close(together=self.error is None and not alone)


def _zero(p: torch.Tensor, set_to_none: bool) -> None:
    if p.grad is None:
        return
    if set_to_none:
        p.grad = None
    else:
        if p.grad.grad_fn is not None:
            p.grad.detach_()
        else:
            p.grad.requires_grad_(False)
        p.grad.zero_()


class _DistributedMixin:
    """Overrides mixed in front of the user's optimizer class."""

    _bpp: _Engine

    def step(self, closure=None):
        engine = self._bpp
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        engine.finish_backward()
        if not engine.layerwise:
            engine.wait_all()
            engine.base_cls.step(self)
        else:
            engine.apply_synchronised()
            if not engine.overlap:
                engine.wait_all()
        engine.step_done()
        return loss

    def zero_grad(self, set_to_none: bool = True):
        engine = self._bpp
        with engine.cond:
            for group in self.param_groups:
                for p in group["params"]:
                    entry = engine.by_id.get(id(p))
                    if entry is not None and entry.pending:
                        entry.zero_after = set_to_none
                    else:
                        _zero(p, set_to_none)

    def synchronize(self):
        """Wait until every gradient is averaged; the update waits for ``step()`` (call it inside
        ``skip_synchronize()``), so the gradients can be read or clipped in between, as with BytePS."""
        self._bpp.finish_backward(stepping=False)
        self._bpp.wait_all()  # every gradient averaged; with overlap, the last step's updates landed too

    @contextlib.contextmanager
    def skip_synchronize(self):
        yield

    def state_dict(self):
        self._bpp.wait_all()
        return super().state_dict()

    def load_state_dict(self, state_dict):
        self._bpp.wait_all()
        super().load_state_dict(state_dict)
        for entry in self._bpp.params:  # the twins share the (new) state
            entry.twin.state = self.state
            group = next(g for g in self.param_groups if any(p is entry.param for p in g["params"]))
            entry.group = group

    def close(self):
        """Wait for outstanding work, remove the hooks, write the profile, leave the process group."""
        self._bpp.close()

    def save_profile(self, path: str | None = None) -> str | None:
        return self._bpp.save_profile(path)

    @property
    def scheduler(self):
        return self._bpp.scheduler


_LIVE: "weakref.WeakSet[_Engine]" = weakref.WeakSet()


@atexit.register
def close_all() -> None:
    """Close every live optimizer (its last updates land, its threads end): at interpreter exit, and
    from the patched ``byteps.torch.shutdown()`` before BytePS stops. After an unhandled exception
    (Ctrl-C too; Python sets ``sys.last_value`` before the exit handlers) nothing is waited for: the
    other ranks may be blocked on this one, and its launcher ends the job once it exits."""
    alone = getattr(sys, "last_value", None) is not None
    for engine in list(_LIVE):
        try:
            engine.close(alone=alone)
        except Exception as err:  # noqa: BLE001 - the others must still close
            print(f"byteps-prophet: optimizer not closed cleanly: {err}", file=sys.stderr, flush=True)


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step: int = 1, *, scheduler: str | None = None,
                         settings: Settings | None = None, backend: str | Backend | None = None,
                         profile_path: str | None = None, model_name: str = "model", batch_size: int = 1,
                         overlap: bool | None = None, layerwise: bool | None = None, **ignored: Any):
    """A drop-in for ``byteps.torch.DistributedOptimizer`` scheduled by FIFO, ByteScheduler or Prophet.

    ``settings`` (default ``Settings.from_env()``: every ``BYTEPS_PROPHET_*`` knob, README "Settings")
    and ``scheduler`` override the environment; ``backend``, ``profile_path``, ``overlap`` and
    ``layerwise`` override those fields of it. Extra BytePS keyword arguments (e.g. ``staleness``) are
    accepted and ignored.
    """
    if settings is None:
        settings = Settings.from_env()
    if scheduler is not None:
        settings = settings.replace(scheduler=scheduler.strip().lower())
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ConfigError(f"backward_passes_per_step={backward_passes_per_step!r} is invalid; valid: an integer >= 1")
    if named_parameters is None:
        named = [(f"param.{i}.{j}", p) for i, g in enumerate(optimizer.param_groups) for j, p in enumerate(g["params"])]
    else:
        named = list(named_parameters)
    if isinstance(optimizer, _DistributedMixin):
        raise ConfigError("DistributedOptimizer: this optimizer is already distributed; valid: a torch.optim optimizer")
    if backend is None or isinstance(backend, str):
        backend = make_backend(backend or default_backend_name(settings))
    if profile_path is None:
        profile_path = settings.profile or None
    overlap = settings.overlap if overlap is None else overlap
    layerwise = settings.layerwise if layerwise is None else layerwise

    base = type(optimizer)
    cls = type(base.__name__, (_DistributedMixin, base), {"__module__": __name__})
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    engine = _Engine(wrapped, base, named, compression, backward_passes_per_step, settings, backend,
                     profile_path, model_name, batch_size, overlap, layerwise)
    wrapped._bpp = engine
    _LIVE.add(engine)
    return wrapped


def broadcast_parameters(params, root_rank: int = 0) -> None:
    """Make every rank's parameters (a state_dict or named_parameters) equal to ``root_rank``'s."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    items = params.items() if hasattr(params, "items") else params
    with torch.no_grad():
        for _, tensor in sorted(items, key=lambda kv: kv[0]):
            if torch.is_tensor(tensor):
                dist.broadcast(tensor.data if hasattr(tensor, "data") else tensor, src=root_rank)
