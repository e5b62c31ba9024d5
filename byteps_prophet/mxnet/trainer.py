"""What the patched ``byteps.mxnet.DistributedTrainer`` (patch 91) runs when ``BYTEPS_SCHEDULER`` is
``bytescheduler`` or ``prophet``: an unmodified Gluon script (``bps.init()``,
``bps.DistributedTrainer(params, optimizer, optimizer_params)``, ``trainer.step(batch)``) gets its
gradients scheduled by byteps_prophet.

:class:`ScheduledGradients` keeps a :class:`~byteps_prophet.mxnet.byteps_backend.BytePSScheduledKVStore`
over the BytePS the script already initialised (the transport neither calls ``init()`` again nor
``shutdown()``: the script and BytePS's own exit handler own that). Per step it does the stock
trainer's math, gradient ``i`` scaled by ``1/(batch_size * workers)`` then summed over the workers,
but hands each gradient to the store (``pushpull(i, grad, out=grad, priority=-i)``, as the stock
``priority``) instead of ``byteps_push_pull``: an engine gate holds the gradient until its atoms are
summed, so the optimizer update that reads it waits, and the scheduler decides when each atom moves.
Parameters are broadcast by the stock code. BytePS gradient compression is not supported with a
scheduler (one-line error, exit 2).
"""
from __future__ import annotations

import atexit
import sys

import mxnet as mx

from byteps_prophet.core import Settings
from byteps_prophet.backends.base import exiting_on_error
from byteps_prophet.backends.byteps_ps import BytePSTransport
from byteps_prophet.mxnet.byteps_backend import BytePSScheduledKVStore

CLOSE_TIMEOUT_S = 60.0  # at exit, the last step's rounds are given this long to finish


class ScheduledGradients:
    def __init__(self, compression_params=None, settings: Settings | None = None) -> None:
        settings = Settings.from_env() if settings is None else settings
        if compression_params:
            sys.stderr.write(f"byteps: compression_params={compression_params!r} cannot be used with "
                             f"BYTEPS_SCHEDULER={settings.scheduler}; valid: no compression_params, "
                             f"or BYTEPS_SCHEDULER=fifo\n")
            sys.stderr.flush()
            raise SystemExit(2)
        self.store = BytePSScheduledKVStore(BytePSTransport("mxnet", init=False), settings=settings)
        self._initialised: set[int] = set()
        self._closed = False
        if self.store.leader:  # one line per job: the scheduling worker says it schedules
            sys.stderr.write(f"byteps_prophet: DistributedTrainer gradients scheduled by "
                             f"{self.store.scheduler.name} over BytePS ({self.store.num_workers} workers)\n")
            sys.stderr.flush()
        # Registered after BytePS's own exit handler (bps.init()), so it runs first (atexit is LIFO).
        atexit.register(self.close)

    def push_pull(self, params, scale: float) -> None:
        """The stock ``_allreduce_grads`` over the store: ``params`` is the trainer's list (gradient
        ``i`` is parameter ``i``'s, as the stock ``gradient_<i>``)."""
        grads = [(i, param._grad[0]) for i, param in enumerate(params) if param.grad_req != "null"]
        for _, grad in grads:
            mx.nd._internal._mul_scalar(grad, scale, out=grad)
        # A key is initialised at its first step, in index order: the same order on every worker.
        new = [(i, grad) for i, grad in grads if i not in self._initialised]
        if new:
            self.store.init([i for i, _ in new], [grad for _, grad in new])
            self._initialised.update(i for i, _ in new)
        for i, grad in grads:
            self.store.pushpull(i, grad, out=grad, priority=-i)

    def close(self) -> None:
        """At exit: the last step's rounds finish, then the store closes. After an unhandled exception
        (``sys.last_value`` set) the store closes alone, waiting for nothing (ScheduledKVStore.close)."""
        if self._closed:
            return
        self._closed = True
        try:
            if exiting_on_error():
                self.store.close(alone=True)
                return
            self.store.flush(timeout=CLOSE_TIMEOUT_S)
            self.store.close()
            if self.store.leader:  # what was scheduled, in one line
                stats = self.store.stats()
                sys.stderr.write(f"byteps_prophet: {self.store.scheduler.name} scheduled {stats['iterations']} "
                                 f"steps of {stats['keys']} gradients in {stats['atoms']} atoms\n")
                sys.stderr.flush()
        except Exception as err:  # noqa: BLE001 - at exit: say it in one line, never a traceback
            sys.stderr.write(f"byteps_prophet: closing the scheduled store failed: {err}\n")
