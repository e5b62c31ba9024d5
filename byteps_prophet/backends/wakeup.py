"""The plugins' timer: calls a scheduler's ``tick()`` at the times it asks for (``on_wakeup``).

Prophet holds a piece while its link model says the link stays busy past the next event (a
completion or a predicted arrival), and decides at that event. A completion can come later than
the model says (a peer behind on a parameter server, a lag read before this iteration fell behind);
the scheduler then asks to be woken at the last moment a piece sent still reaches the link as it
frees. One daemon thread per plugin, started at the first request (FIFO and ByteScheduler never
ask), waiting on a condition until the earliest time asked for.
"""
from __future__ import annotations

import threading
from typing import Callable


def install_wakeup_timer(scheduler, tick: Callable[[], None],
                         on_error: Callable[[BaseException], None]) -> "WakeupTimer":
    """Give ``scheduler`` a timer (``on_wakeup``) that calls ``tick`` at the times it asks for."""
    timer = WakeupTimer(scheduler.clock, tick, on_error)
    scheduler.on_wakeup = timer.request
    return timer


class WakeupTimer:
    def __init__(self, clock, tick: Callable[[], None], on_error: Callable[[BaseException], None]) -> None:
        """``tick`` is called on this thread, at the times ``request`` is given (``clock`` seconds);
        it takes the plugin's lock itself. A failure in it goes to ``on_error`` and stops the timer."""
        self._clock, self._tick, self._on_error = clock, tick, on_error
        self._cond = threading.Condition()
        self._at: float | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    def request(self, at: float) -> None:
        """Call ``tick`` at ``at``, or earlier for an earlier request (any thread; never blocks on a tick)."""
        with self._cond:
            if self._closed:
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="bpp-wakeup", daemon=True)
                self._thread.start()
            if self._at is None or at < self._at:
                self._at = at
                self._cond.notify()

    def close(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed:
                    if self._at is not None:
                        wait = self._at - self._clock.now()
                        if wait <= 0:
                            break
                        self._cond.wait(wait)
                    else:
                        self._cond.wait()
                if self._closed:
                    return
                self._at = None
            try:
                self._tick()
            except BaseException as err:  # noqa: BLE001 - the plugin surfaces it on its next call
                self._on_error(err)
                return
