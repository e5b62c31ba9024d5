"""Listeners on the gradient engine's events: the profile recorder and the trace.

The engine (torch/gradient_engine.py) calls each listener's methods as things happen; a listener only
observes and never changes what the engine does. Times are the engine's clock, in seconds. The
adapters here turn the events into :class:`~byteps_prophet.profile.ProfileRecorder` calls
(``BYTEPS_PROPHET_PROFILE``, docs/PYTORCH.md "Profile") and :class:`~byteps_prophet.core.trace.TraceLog`
events (``BYTEPS_PROPHET_TRACE``, docs/PYTORCH.md "Trace").
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from byteps_prophet.backends.base import FusedOp, Op
from byteps_prophet.core.trace import TraceLog, trace_path, writable

if TYPE_CHECKING:
    from byteps_prophet.torch.gradient_engine import GradientEngine
    from byteps_prophet.torch.parameter_updates import ParameterState

_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
                torch.float64: "float64"}


class EngineListener:
    """Every event, as a no-op. Calls come from the training thread unless said otherwise."""

    def on_forward_pre(self, module, now: float) -> None:
        """A module's forward is called, before it waits for its parameters' updates."""

    def on_forward_wait(self, first: "ParameterState", start: float, end: float, blocked: bool) -> None:
        """The forward waited from ``start`` to ``end`` for the updates of its parameters (``first`` of
        them); ``blocked``: one was still coming when it began."""

    def on_forward_start(self, module, now: float) -> None:
        """The module's forward computation starts (after any wait)."""

    def on_forward_end(self, module, now: float) -> None:
        """The module's forward returned. The engine installs this hook only for a listener that
        overrides it."""

    def on_gradient_ready(self, entry: "ParameterState", now: float, nbytes: int) -> None:
        """A gradient is ready and about to be posted (``nbytes`` on the wire)."""

    def on_posted(self, iteration: int, now: float) -> None:
        """Leader, under the scheduler's lock: the scheduler has the gradient just made ready."""

    def on_end_of_backward(self, iteration: int, now: float) -> None:
        """No more gradients come this iteration."""

    def on_op_submitted(self, op: Op, now: float) -> None:
        """Leader, under the scheduler's lock: the scheduler sends ``op``."""

    def on_op_finished(self, op: Op, now: float) -> None:
        """Completion thread (the leader's under the scheduler's lock): ``op`` is synchronised."""

    def on_step(self, iteration: int, now: float) -> None:
        """``step()`` for ``iteration`` is done."""

    def on_close(self) -> None:
        """The engine closes (its threads ended): write what was recorded."""


def listeners_for(engine: "GradientEngine", model_name: str, batch_size: int) -> list[EngineListener]:
    """The listeners the settings ask for; their output paths are checked here, before a thread starts."""
    listeners: list[EngineListener] = []
    if engine.settings.trace:
        listeners.append(TraceListener(engine, engine.settings.trace))
    if engine.settings.profile:
        listeners.append(ProfileListener(engine, engine.settings.profile, model_name, batch_size))
    return listeners


class TraceListener(EngineListener):
    """Every rank logs its events with their times (docs/PYTORCH.md, "Trace"): rank 0 at the path, the
    others beside it."""

    def __init__(self, engine: "GradientEngine", path: str) -> None:
        self.engine, self.path = engine, path
        rank = engine.backend.rank
        writable(trace_path(path, rank, primary=rank == 0))
        self.trace = TraceLog(rank, f"rank {rank}")

    def on_forward_wait(self, first, start, end, blocked) -> None:
        if blocked:
            self.trace.span("wait", f"forward waits for {first.name}", start, end,
                            track="training", iteration=self.engine.iteration, index=first.index)

    def on_gradient_ready(self, entry, now, nbytes) -> None:
        self.trace.instant("ready", entry.name, now, iteration=self.engine.iteration, index=entry.index,
                           bytes=nbytes)

    def on_posted(self, iteration, now) -> None:
        self.trace.plan(self.engine.scheduler, iteration, now)

    def on_end_of_backward(self, iteration, now) -> None:
        self.trace.instant("eob", "end of backward", now, iteration=iteration)

    def on_op_submitted(self, op, now) -> None:
        op.extra["submit"] = now

    def on_op_finished(self, op, now) -> None:
        members = op.members if isinstance(op, FusedOp) else (op,)
        scheduler = self.engine.scheduler
        if scheduler is not None:
            bw = scheduler.bandwidth  # the cost the scheduler reads: a fused collective's, if it fuses
            cost = bw.rate_and_cost(getattr(scheduler, "fuses", False))[1]
            for member in members:
                self._span(op, member, member.piece.index, member.piece.nbytes, now, op.extra.get("submit"),
                           bandwidth_Bps=bw.bytes_per_s, message_cost_s=cost, latency_s=bw.latency)
            return
        for member in members:  # a follower: the scheduler's fields are rank 0's
            self._span(op, member, self.engine.by_name[member.name].index,
                       member.tensor.numel() * member.tensor.element_size(), now, None)

    def _span(self, op: Op, member: Op, index: int, nbytes: int, done: float, submit: float | None,
              **leader) -> None:
        """One op's ``member`` (the op itself unless fused) as a span from the op's submission to the
        scheduler's transport (the leader) or its issue to the engine (a follower) to its completion."""
        issue = op.extra.get("issue")
        start = submit if submit is not None else issue if issue is not None else done
        self.trace.span("op", member.name, start, done, iteration=op.iteration, index=index,
                        rows=[member.row_start, member.row_end], bytes=nbytes,
                        submit_ts=None if submit is None else round(submit * 1e6, 3),
                        issue_ts=None if issue is None else round(issue * 1e6, 3), **leader)

    def on_step(self, iteration, now) -> None:
        self.trace.instant("step", "step", now, iteration=iteration)

    def on_close(self) -> None:
        self.save()

    def save(self) -> str | None:
        engine = self.engine
        rank = engine.backend.rank
        scheduler = engine.scheduler
        meta = {"framework": "pytorch", "rank": rank, "scheduler": engine.settings.scheduler,
                "backend": engine.backend.name, "world_size": engine.backend.size,
                "serializations": engine.traits.stages,
                # iterations Prophet's prediction scheduled (not its fallback, the credit): leader only
                "planned_iterations": getattr(scheduler, "planned_iterations", None),
                "credit_iterations": dict(getattr(scheduler, "credit_iterations", {})),
                "tensors": [[e.index, e.name, list(e.param.shape), e.param.numel() * e.param.element_size()]
                            for e in engine.params]}
        return self.trace.save(trace_path(self.path, rank, primary=rank == 0), meta)


class ProfileListener(EngineListener):
    """Per iteration: each gradient's ready time after backward start, each layer's exclusive forward
    time (a parameter-less module's goes to the next module with parameters; a wait for updates counts
    for no module), the iteration time and rank 0's bandwidth (docs/PROFILE.md)."""

    def __init__(self, engine: "GradientEngine", path: str, model_name: str, batch_size: int) -> None:
        from byteps_prophet.profile import ProfileRecorder

        self.engine, self.path = engine, path
        rank = engine.backend.rank
        if "{rank}" in path or rank == 0:
            writable(path.replace("{rank}", str(rank)), "BYTEPS_PROPHET_PROFILE")
        params = engine.params
        tensors = [(e.name, tuple(e.param.shape) or (1,), _DTYPE_NAMES.get(e.param.dtype, "float32"))
                   for e in params]
        settings = engine.settings
        self.recorder = ProfileRecorder(tensors, model=model_name, framework="pytorch", batch=batch_size,
                                        device=str(params[0].param.device) if params else "cpu",
                                        world_size=engine.backend.size, warmup=2,
                                        meta={"scheduler": settings.scheduler, "backend": engine.backend.name,
                                              "rank": rank, "fuse": settings.fuse})
        self._fwd_stack: list[list] = []  # [module, start, children's time] per open forward
        self._unattributed = 0.0  # exclusive time of parameter-less modules, for the next one with some
        self._open = False
        self._end_pending = False  # step() done: the iteration ends at the next forward
        self._last_forward_end: float | None = None
        self._iter_begin = self._bwd_start = 0.0
        self._bwd_marked = False

    def _ensure_open(self, now: float) -> None:
        if self._open:
            return
        self.recorder.begin_iteration(now)
        self._fwd_stack.clear()
        self._unattributed = 0.0
        self._bwd_start = self._iter_begin = now
        self._bwd_marked = False
        self._last_forward_end = None
        self._open = True

    def on_forward_pre(self, module, now) -> None:
        if self._end_pending:
            self._end_iteration(now)
            self._end_pending = False
        self._ensure_open(now)

    def on_forward_wait(self, first, start, end, blocked) -> None:
        if self._fwd_stack:
            # the wait falls in the enclosing module's span: not its compute either (else a
            # container's waits reach the profile as the next layer's forward time)
            self._fwd_stack[-1][2] += end - start

    def on_forward_start(self, module, now) -> None:
        self._fwd_stack.append([module, now, 0.0])  # started after any wait

    def on_forward_end(self, module, now) -> None:
        if not self._fwd_stack:
            return
        mod, start, children = self._fwd_stack.pop()
        duration = now - start
        if self._fwd_stack:
            self._fwd_stack[-1][2] += duration
        else:
            self._last_forward_end = now
        exclusive = max(0.0, duration - children) + self._unattributed
        by_id = self.engine.by_id
        first = next((by_id[id(p)] for p in mod._parameters.values() if p is not None and id(p) in by_id), None)
        if first is None:
            self._unattributed = exclusive
        else:
            self._unattributed = 0.0
            if self._open:
                self.recorder.forward_time(first.name, exclusive)

    def on_gradient_ready(self, entry, now, nbytes) -> None:
        self._ensure_open(now)
        if not self._bwd_marked:
            start = self._last_forward_end if self._last_forward_end is not None else now
            self._bwd_start, self._bwd_marked = max(start, self._iter_begin), True
            self.recorder.backward_start(self._bwd_start)
        self.recorder.gradient_ready(entry.name, max(now, self._bwd_start))

    def on_step(self, iteration, now) -> None:
        if self._open:
            self._end_pending = True

    def _end_iteration(self, now: float) -> None:
        if not self._open:
            return
        scheduler = self.engine.scheduler
        bandwidth = scheduler.bandwidth.bytes_per_s if scheduler is not None and scheduler.bandwidth.known else None
        self.recorder.end_iteration(now, bandwidth_Bps=bandwidth)
        self._open = False

    def on_close(self) -> None:
        import sys

        from byteps_prophet.errors import UserError

        try:
            self.save()
        except UserError as err:  # a profile problem must not fail the training job
            print(f"byteps-prophet: profile not written: {err}", file=sys.stderr, flush=True)

    def save(self, path: str | None = None) -> str | None:
        """Write the profile (rank 0, or every rank where the path has ``{rank}``); its path, or None."""
        path = path or self.path
        if not path or self.recorder.iterations_recorded == 0:
            return None
        if "{rank}" in path:
            path = path.replace("{rank}", str(self.engine.backend.rank))
        elif self.engine.backend.rank != 0:
            return None
        self.recorder.profile().save(path)
        return path
