"""Engine hooks of the MXNet stores: gates and notifications, without a cluster."""
from __future__ import annotations

import ctypes
import threading
import time

import pytest

mx = pytest.importorskip("mxnet")

from mxnet.base import _LIB, NDArrayHandle, check_call  # noqa: E402

from byteps_prophet.mxnet.gates import EngineGate, Notifier, copy_raw  # noqa: E402

_SYNC_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)


def _occupy_cpu_worker(seconds: float, array):
    """A normal-priority engine op that holds MXNet's CPU worker (as a long backward op would)."""
    fn = _SYNC_FN(lambda _ctx, _param: time.sleep(seconds))
    handles = (NDArrayHandle * 1)(array.handle)
    c_ctx = (ctypes.c_int * 2)(1, 0)
    check_call(_LIB.MXEnginePushSyncND(fn, None, None, ctypes.byref(c_ctx), None, 0, handles, 1,
                                      None, 0, b"test_busy", False))
    return fn  # the caller keeps it alive until the op ran


def test_notifier_runs_after_the_write_not_behind_a_busy_cpu_worker():
    errors = []
    notifier = Notifier(errors.append)
    gate = EngineGate()
    result = mx.nd.zeros((8,))
    token = gate.hold([result])  # a transfer that writes ``result``, done at 0.2 s
    busy = mx.nd.zeros((1,))
    keep = _occupy_cpu_worker(1.5, busy)
    ran = threading.Event()
    t0 = time.monotonic()
    notifier.when_free([result], [], ran.set)
    threading.Timer(0.2, lambda: gate.release(token)).start()
    assert not ran.wait(0.1)  # not before the write completed
    assert ran.wait(1.0)  # but long before the busy CPU worker is free (1.5 s)
    assert time.monotonic() - t0 < 1.2
    busy.wait_to_read()
    del keep
    assert errors == []


def test_notifier_may_write_what_it_holds_and_later_readers_see_it():
    notifier = Notifier(lambda err: None)
    src = mx.nd.full((16,), 5.0)
    dst = mx.nd.zeros((16,))
    notifier.when_free([src], [dst], lambda: copy_raw(src, dst))
    assert (dst * 2).asnumpy().tolist() == [10.0] * 16


def test_notifier_reports_a_failing_callback_and_releases_the_engine():
    errors = []
    notifier = Notifier(errors.append)
    dst = mx.nd.zeros((4,))

    def boom():
        raise ValueError("callback failed")
    notifier.when_free([], [dst], boom)
    assert (dst + 1).asnumpy().tolist() == [1.0] * 4  # the engine went on
    assert len(errors) == 1 and "callback failed" in str(errors[0])
