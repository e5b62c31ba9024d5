"""Continuous bandwidth and latency measurement from completed transfers.

Delivery-rate sampling as in BBR: when a transfer finishes, the bytes delivered since it was sent,
divided by its time in flight, is one sample of the bottleneck rate. The estimate is the maximum over
the most recent samples (queueing and idle gaps only ever make a sample smaller), so it follows a
drop in bandwidth within ``window`` completions and a rise at once.

The base latency is the smallest (time in flight - serialisation time) seen recently: the per-message
cost the link charges whatever the size. ``serializations`` says how often a byte crosses the
bottleneck per transfer: 2 for a parameter-server push then pull, 1 for an all-reduce.
"""
from __future__ import annotations

from collections import deque


class BandwidthMonitor:
    def __init__(self, window: int = 24, serializations: int = 1) -> None:
        self.window = window
        self.serializations = serializations
        self._delivered = 0
        self._in_flight: dict[int, tuple[float, int]] = {}
        self._rates: deque[float] = deque(maxlen=window)
        self._flights: deque[tuple[float, int]] = deque(maxlen=window)  # (seconds in flight, bytes)
        self.samples = 0

    def on_send(self, task, now: float) -> None:
        self._in_flight[id(task)] = (now, self._delivered)

    def on_finish(self, task, now: float) -> None:
        sent_at, delivered_at_send = self._in_flight.pop(id(task), (None, 0))
        self._delivered += task.nbytes
        if sent_at is None:
            return
        elapsed = now - sent_at
        if elapsed <= 0:
            return
        self._rates.append((self._delivered - delivered_at_send) / elapsed)
        self._flights.append((elapsed, task.nbytes))
        self.samples += 1

    @property
    def known(self) -> bool:
        return bool(self._rates)

    @property
    def bytes_per_s(self) -> float | None:
        """Bottleneck rate in bytes/s, or None before the first completion."""
        return max(self._rates) if self._rates else None

    @property
    def base_latency(self) -> float:
        """Per-message time in flight beyond serialisation, seconds (0 before any sample)."""
        rate = self.bytes_per_s
        if not rate:
            return 0.0
        return max(0.0, min(t - self.serializations * n / rate for t, n in self._flights))

    @property
    def in_flight_count(self) -> int:
        return len(self._in_flight)

    def reset(self) -> None:
        self._rates.clear()
        self._flights.clear()
