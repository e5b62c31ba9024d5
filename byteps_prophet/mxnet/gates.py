"""Engine gates: hold an MXNet array's write dependency open until Python says it is synchronised.

Why: a scheduler sends a parameter's slices *later* than ``pushpull`` is called, but MXNet orders
operations by the order they are pushed to its engine. If the next forward pass is pushed before the
scheduler has pushed the pull that writes the parameter, the forward would read the old weights.

A gate is an asynchronous engine operation that *mutates* the arrays (the parameter, or the gradient
when the optimizer runs on the worker). It is pushed at ``pushpull`` time, so every operation the user
pushes afterwards that reads those arrays (the next forward of *that* layer only) waits for it. The
scheduled pulls write a staging buffer instead; when all of a parameter's rows are synchronised,
``release`` copies the staging buffer into the arrays while the gate holds them, then completes it.

Pure Python: ``MXEnginePushAsyncND`` through ctypes; the engine hands the async function a pointer to
its ``CallbackOnComplete`` (three pointers: the function, the engine, its parameter), which we copy
and call later with a null error.
"""
from __future__ import annotations

import ctypes
import itertools
import threading
from typing import Callable, Sequence

import mxnet as mx
import numpy as np
from mxnet.base import NDArrayHandle, _LIB, check_call

_ASYNC_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_COMPLETE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_DEV_TYPES = {"cpu": 1, "gpu": 2, "cpu_pinned": 3, "cpu_shared": 5}


def data_pointer(array: mx.nd.NDArray) -> int:
    """Address of the array's first element (views included); does not wait on the engine."""
    ptr = ctypes.c_void_p()
    check_call(_LIB.MXNDArrayGetData(array.handle, ctypes.byref(ptr)))
    return ptr.value or 0


def copy_raw(src: mx.nd.NDArray, dst: mx.nd.NDArray, src_offset: int = 0) -> None:
    """memmove all of dst's bytes from src, starting ``src_offset`` bytes into src (CPU; no view is
    made). Only call while nothing in the engine writes dst or src (a gate holds dst, src's writes
    are known complete)."""
    nbytes = dst.size * np.dtype(dst.dtype).itemsize
    if src_offset < 0 or src_offset + nbytes > src.size * np.dtype(src.dtype).itemsize:
        raise ValueError(f"copy_raw: {dst.shape} {dst.dtype} from {src.shape} {src.dtype} at byte {src_offset}")
    ctypes.memmove(data_pointer(dst), data_pointer(src) + src_offset, nbytes)


class EngineGate:
    """Gates keyed by integer tokens. ``hold`` pushes one; ``release(token, action)`` runs ``action``
    once the engine has started the gate (all earlier users of the arrays are done), then completes it.
    Either may come first; the action always runs while the gate holds the arrays."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tokens = itertools.count(1)
        self._started: dict[int, tuple[int, int, int]] = {}
        self._released: dict[int, Callable[[], None]] = {}
        self._errors: list[BaseException] = []
        self._unreleased: set[int] = set()
        self._fn = _ASYNC_FN(self._on_start)  # keep a reference for the library's lifetime

    def hold(self, arrays: Sequence[mx.nd.NDArray]) -> int:
        token = next(self._tokens)
        with self._lock:
            self._unreleased.add(token)
        _push_async(self._fn, token, [], arrays, None, b"byteps_prophet_gate")
        return token

    def release(self, token: int, action: Callable[[], None] | None = None) -> None:
        """Run ``action`` under the gate, then open it (a gate already released: nothing)."""
        with self._lock:
            if token not in self._unreleased:
                return
            self._unreleased.discard(token)
        action = action or (lambda: None)
        callback = self._meet(token, self._released, action, self._started)
        if callback is not None:
            self._finish(callback, action)

    def open_all(self) -> None:
        """Open every gate not released yet, with no action: a process leaving on an error lets the
        engine drain (MXNet waits for every pushed op at exit) without the results it will not use."""
        with self._lock:
            tokens = list(self._unreleased)
        for token in tokens:
            self.release(token)

    @property
    def open_gates(self) -> int:
        with self._lock:
            return len(self._started) + len(self._released)

    def _on_start(self, _rctx, on_complete, param) -> None:
        callback = _completion(on_complete)
        action = self._meet(param or 0, self._started, callback, self._released)
        if action is not None:
            self._finish(callback, action)

    def _meet(self, token: int, mine: dict, value, theirs: dict):
        """A gate opens when both its start (the engine's) and its release (ours) have come, in
        either order: the first leaves ``value`` in ``mine``; the second gets the first's from ``theirs``."""
        with self._lock:
            other = theirs.pop(token, None)
            if other is None:
                mine[token] = value
            return other

    def _finish(self, callback: tuple[int, int, int], action: Callable[[], None]) -> None:
        try:
            action()
        except BaseException as err:  # never leave the engine waiting on a gate
            self._errors.append(err)
        finally:
            _complete(callback)


def _push_async(fn, token: int, reads: Sequence[mx.nd.NDArray], writes: Sequence[mx.nd.NDArray],
                prop: ctypes.c_int | None, name: bytes) -> None:
    """Push the asynchronous engine op ``fn(token)`` that reads ``reads`` and mutates ``writes``."""
    const = (NDArrayHandle * len(reads))(*[a.handle for a in reads])
    mutable = (NDArrayHandle * len(writes))(*[a.handle for a in writes])
    ctx = (list(reads) + list(writes))[0].context
    c_ctx = (ctypes.c_int * 2)(_DEV_TYPES.get(ctx.device_type, 1), ctx.device_id)
    check_call(_LIB.MXEnginePushAsyncND(
        fn, ctypes.c_void_p(token), None, ctypes.byref(c_ctx), const, len(reads), mutable, len(writes),
        None if prop is None else ctypes.byref(prop), 0, name, False))


def _completion(on_complete) -> tuple[int, int, int]:
    """Copy the engine's ``CallbackOnComplete`` (the function, the engine, its parameter)."""
    words = ctypes.cast(on_complete, ctypes.POINTER(ctypes.c_void_p * 3)).contents
    return words[0], words[1], words[2]


def _complete(callback: tuple[int, int, int]) -> None:
    fn, engine, param = callback
    _COMPLETE_FN(fn)(engine, param, None)


_CPU_PRIORITIZED = ctypes.c_int(3)  # FnProperty::kCPUPrioritized: the engine's own priority workers


class Notifier:
    """``when_free(reads, writes, fn)`` runs ``fn()`` inside the engine as soon as every earlier write
    of ``reads`` and every earlier use of ``writes`` is done (so ``fn`` may read and write them).

    Why not ``wait_to_read`` in a thread: that pushes a normal-priority engine op, and while backward
    keeps MXNet's CPU worker busy it waits behind compute, so a store would learn of a staged gradient
    or a finished transfer only when backward ends. This op runs on the engine's prioritised CPU
    workers and holds no thread while it waits; ``fn`` must be short. An exception in ``fn`` goes to
    ``on_error`` and the engine goes on."""

    _lock = threading.Lock()
    _tokens = itertools.count(1)
    _pending: dict[int, tuple[Callable[[], None], Callable[[BaseException], None]]] = {}

    def __init__(self, on_error: Callable[[BaseException], None]) -> None:
        self._on_error = on_error

    def when_free(self, reads: Sequence[mx.nd.NDArray], writes: Sequence[mx.nd.NDArray],
                  fn: Callable[[], None]) -> None:
        token = next(Notifier._tokens)
        with Notifier._lock:
            Notifier._pending[token] = (fn, self._on_error)
        _push_async(_NOTIFY_FN, token, reads, writes, _CPU_PRIORITIZED, b"byteps_prophet_notify")


def _notify(_rctx, on_complete, param) -> None:
    callback = _completion(on_complete)
    with Notifier._lock:
        fn, on_error = Notifier._pending.pop(param or 0)
    try:
        fn()
    except BaseException as err:  # never leave the engine waiting
        on_error(err)
    finally:
        _complete(callback)


# One trampoline for the process: an op may still be queued in the engine when its store is gone.
_NOTIFY_FN = _ASYNC_FN(_notify)
