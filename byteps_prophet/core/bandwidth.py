"""Continuous measurement of the link from completed transfers: bandwidth and per-message cost.

Two estimators, both fed only by send and finish events:

* Service times. A FIFO link of ``serializations`` stages (push, pull) spent at most the time since
  the previous completion on a transfer, and at most 1/serializations of its time in flight; the
  smaller of the two is exact when the transfer ran alone or is no larger than the one before it
  (otherwise it may include a bubble in the later stage, and is skipped). A least-squares line
  through recent (bytes, service time) samples gives a per-message cost (intercept) and the
  bandwidth (1 / slope). This sees through queueing, which a busy pipe always has.
* Delivery rate, as in BBR: bytes delivered while a transfer was in flight over its time in flight;
  the recent maximum. Used until enough service samples exist, or when their sizes do not vary
  enough to separate cost from bandwidth.

Both windows are short, so a bandwidth change is followed within a few dozen transfers.
"""
from __future__ import annotations

from collections import deque

MIN_FIT_SAMPLES = 8
_INF = float("inf")
_NOT_SENT = (None, 0)


class RunningFit:
    """Least squares y = a + b x over a sliding window, O(1) per sample: the one line fit of the
    monitors and of calibration."""

    def __init__(self, window: int) -> None:
        self._samples: deque[tuple[float, float]] = deque()
        self._window = window
        self._n = self._sx = self._sy = self._sxx = self._sxy = 0.0

    def add(self, x: float, y: float) -> None:
        samples = self._samples
        samples.append((x, y))
        self._n += 1
        self._sx += x
        self._sy += y
        self._sxx += x * x
        self._sxy += x * y
        if len(samples) > self._window:
            x, y = samples.popleft()
            self._n -= 1
            self._sx -= x
            self._sy -= y
            self._sxx -= x * x
            self._sxy -= x * y

    def clear(self) -> None:
        self.__init__(self._window)

    @property
    def samples(self) -> deque[tuple[float, float]]:
        return self._samples

    def keep_last(self, count: int) -> None:
        recent = list(self._samples)[-count:] if count else []
        self.clear()
        for x, y in recent:
            self.add(x, y)

    def fit(self, flat_through_origin: bool = False) -> tuple[float, float] | None:
        """(intercept, slope), or None when the sizes do not spread enough to tell them apart (with
        ``flat_through_origin``, a line through the origin with the same mean then)."""
        n = self._n
        if n < MIN_FIT_SAMPLES:
            return None
        mean_x, mean_y = self._sx / n, self._sy / n
        var_x = self._sxx / n - mean_x * mean_x
        if var_x <= (0.05 * mean_x) ** 2:
            return (0.0, mean_y / mean_x) if flat_through_origin and mean_x > 0 and mean_y > 0 else None
        slope = (self._sxy / n - mean_x * mean_y) / var_x
        if slope <= 0:
            return None
        intercept = mean_y - slope * mean_x
        if intercept < 0:  # noise: a line through the origin with the same mean
            return 0.0, mean_y / mean_x
        return intercept, slope


class BandwidthMonitor:
    # Seconds between sending an op and its bytes reaching the link (an engine's start-up, which ops
    # already in flight overlap): not a cost the link serialises. Completions cannot tell it apart
    # here, so it is 0 unless told (set the attribute) or measured by a subclass
    # (``byteps_prophet.core.link_monitor.LinkMonitor``).
    latency: float = 0.0

    def __init__(self, window: int = 64, serializations: int = 1) -> None:
        self.serializations = serializations
        self._delivered = 0
        self._in_flight: dict[int, tuple[float, int]] = {}
        self._rates: deque[float] = deque(maxlen=window // 2)
        self._service = RunningFit(window)
        self._last_finish = float("-inf")
        self._last_bytes = 0
        self._cached: tuple[int, tuple[float, float] | None] = (-1, None)
        self.samples = 0

    def on_send(self, task, now: float) -> None:
        self._in_flight[id(task)] = (now, self._delivered)

    def on_finish(self, task, now: float) -> None:
        sent_at, delivered_at_send = self._in_flight.pop(id(task), _NOT_SENT)
        self._delivered += task.nbytes
        if sent_at is None:
            return
        if now > sent_at:
            self._rates.append((self._delivered - delivered_at_send) / (now - sent_at))
            self.samples += 1
        # The bottleneck spent at most the time since the previous completion on this transfer, and
        # at most 1/serializations of its time in flight (each byte crosses it that often in turn).
        # Both are exact with one stage, when it ran alone, or when it is no larger than the one
        # before it; a larger one queued behind a smaller one may also include a pipeline bubble.
        nbytes, last_finish, stages = task.nbytes, self._last_finish, self.serializations
        service = min(now - last_finish, (now - sent_at) / stages)
        exact = stages == 1 or sent_at >= last_finish or nbytes <= self._last_bytes
        if exact and 0 < service < _INF:
            self._service.add(nbytes, service)
        self._last_finish, self._last_bytes = now, nbytes

    def _fit(self) -> tuple[float, float] | None:
        if self._cached[0] != self.samples:
            self._cached = (self.samples, self._service.fit())
        return self._cached[1]

    @property
    def known(self) -> bool:
        return bool(self._rates)

    @property
    def bytes_per_s(self) -> float | None:
        """Bottleneck rate in bytes/s, or None before the first completion."""
        fit = self._fit()
        if fit is not None:
            return 1.0 / fit[1]
        return max(self._rates) if self._rates else None

    def rate_and_cost(self, collective: bool = False) -> tuple[float | None, float]:
        """``(bytes_per_s, message_cost)`` from one fit: what a scheduler reads per decision (the same
        for a fused collective: ``collective`` matters to ``LinkMonitor`` only)."""
        fit = self._fit()
        if fit is not None:
            return 1.0 / fit[1], fit[0]
        return (max(self._rates) if self._rates else None), 0.0

    @property
    def message_cost(self) -> float:
        """Seconds the bottleneck spends on a message besides its bytes (0 until measured)."""
        fit = self._fit()
        return fit[0] if fit is not None else 0.0

    @property
    def in_flight_count(self) -> int:
        return len(self._in_flight)

    def reset(self) -> None:
        self._rates.clear()
        self._service.clear()
