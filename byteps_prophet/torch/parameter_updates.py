"""Per-parameter updates: each parameter's state, its twin optimizer, and the ledger of updates.

A parameter is *pending* from the moment its gradient is posted until its update has landed. Once
its gradient is synchronised its update is applied at once if its iteration's ``step()`` was called,
else *held* for that ``step()`` (docs/DESIGN.md, "Stock step() semantics by default"), so that between
``synchronize()`` and ``step()`` the user sees, and may clip, the averaged gradient. The update is the
user's optimizer class stepping a shallow *twin* that holds this one parameter and shares the
optimizer's state; the twin re-reads its group's hyper-parameters at each step, so LR schedulers work.
"""
from __future__ import annotations

import threading
from typing import Iterable

import torch

from byteps_prophet.backends.base import BackendError

WAIT_SLICE = 1.0  # seconds between checks for a failure while waiting


class ParameterState:
    """One trainable parameter as the plugin tracks it between its gradient and its update."""

    __slots__ = ("name", "index", "param", "group", "twin", "pending", "synced", "zero_after", "payload", "ctx",
                 "rows_left", "posted_iteration")

    def __init__(self, name, index, param, group, twin):
        self.name, self.index, self.param, self.group, self.twin = name, index, param, group, twin
        self.pending = False  # synchronisation or update outstanding
        self.synced = False  # synchronised, its update held for its step() (step() applies it)
        self.zero_after: bool | None = None  # zero_grad(set_to_none) deferred until after the update
        self.payload = None  # the 2-D tensor on the wire
        self.ctx = None  # compression context
        self.rows_left = 0  # follower: rows of this gradient not yet synchronised
        self.posted_iteration = -1


def make_twin(opt: torch.optim.Optimizer, base_cls: type, group: dict, param) -> torch.optim.Optimizer:
    """An optimizer of ``base_cls`` over ``param`` alone, sharing ``opt``'s state."""
    twin = object.__new__(base_cls)
    twin.__dict__.update(opt.__dict__)
    twin.param_groups = [dict(group, params=[param])]
    return twin


def zero_grad_of(p: torch.Tensor, set_to_none: bool) -> None:
    """What ``Optimizer.zero_grad`` does to one parameter."""
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


class UpdateLedger:
    """Which updates are pending, held or landed, and the first failure of any thread. ``cond`` guards
    every flag; ``_apply`` runs exactly once per update, on the completion thread or in ``step()``."""

    def __init__(self, params: list[ParameterState], base_cls: type, compression, layerwise: bool) -> None:
        self.params, self.base_cls, self.compression, self.layerwise = params, base_cls, compression, layerwise
        self.cond = threading.Condition()
        self.error: BaseException | None = None
        self.pending_count = 0
        self._held_count = 0  # entries synced and held for their step()
        self._stepped = -1  # the last iteration whose step() was called: its updates apply as they come

    def begin(self, entry: ParameterState) -> None:
        """The gradient is posted: its update is pending."""
        with self.cond:
            entry.pending = True
            self.pending_count += 1

    def synchronised(self, entry: ParameterState) -> None:
        """Completion thread: the gradient is averaged. Its update applies now if its step() was called
        (or without layer-wise updates, where step() steps the whole optimizer); else step() applies it."""
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

    def _apply(self, entry: ParameterState) -> None:
        """Step this parameter alone (layer-wise), then mark it done."""
        if self.layerwise:
            twin_group = entry.twin.param_groups[0]
            for key, value in entry.group.items():
                if key != "params":
                    twin_group[key] = value
            self.base_cls.step(entry.twin)
        with self.cond:
            if entry.zero_after is not None:
                zero_grad_of(entry.param, entry.zero_after)
                entry.zero_after = None
            entry.pending = False
            self.pending_count -= 1
            self.cond.notify_all()

    def apply_held(self, iteration: int) -> None:
        """step(): ``iteration``'s updates apply from now on; those already synchronised apply here."""
        with self.cond:
            self._stepped = iteration
            ready = [e for e in self.params if e.synced] if self._held_count else []
            for entry in ready:
                entry.synced = False
            self._held_count = 0
        for entry in ready:
            self._apply(entry)

    def zero_grad(self, param_groups: list[dict], by_id: dict[int, ParameterState], set_to_none: bool) -> None:
        """Zero every gradient now, except a pending one's: that waits until just after its update."""
        with self.cond:
            for group in param_groups:
                for p in group["params"]:
                    entry = by_id.get(id(p))
                    if entry is not None and entry.pending:
                        entry.zero_after = set_to_none
                    else:
                        zero_grad_of(p, set_to_none)

    @staticmethod
    def coming(entry: ParameterState) -> bool:
        """Under cond: an update that will land without the user doing anything more (one synchronised
        and held for its step() does not)."""
        return entry.pending and not entry.synced

    def fail(self, err: BaseException) -> None:
        """Any thread: keep the first failure and wake every waiter, which raises it."""
        with self.cond:
            if self.error is None:
                self.error = err
            self.cond.notify_all()

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise BackendError(str(self.error))

    def wait_for(self, entries: Iterable[ParameterState]) -> None:
        """Until none of ``entries`` has an update coming."""
        entries = list(entries)
        with self.cond:
            while True:
                if self.error is not None:
                    raise BackendError(str(self.error))
                if not any(self.coming(e) for e in entries):
                    return
                self.cond.wait(WAIT_SLICE)

    def wait_all(self) -> None:
        """Until every update that is coming has landed (not those held for their step())."""
        with self.cond:
            while self.error is None and self.pending_count > self._held_count:
                self.cond.wait(WAIT_SLICE)
        self.raise_if_failed()
