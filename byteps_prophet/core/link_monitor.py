"""How a real engine's link is measured: which completions are samples of the link.

On a real engine an op's time in flight is not link time (an all-reduce starts only when every rank
issued it; each op pays a start-up latency that others in flight overlap), so :class:`LinkMonitor`
feeds the core's estimators differently: service samples only from back-to-back completions; the
recent peak delivery rate as the fallback rate; the idle-link start-up ``latency`` tracked apart (it
never enters the per-message cost); a change of the link detected after ``SHIFT_RUN`` samples off the
fit by ``SHIFT_RATIO``, not averaged away. Why: docs/DESIGN.md, "Link monitor (plugins)", "Start-up
latency" and "Fused collectives".
"""
from __future__ import annotations

import statistics
from collections import deque

from byteps_prophet.core.bandwidth import MIN_FIT_SAMPLES, BandwidthMonitor, RunningFit
from byteps_prophet.core.settings import Settings

SHIFT_RUN = 4
SHIFT_RATIO = 1.4


class LinkMonitor(BandwidthMonitor):
    def __init__(self, window: int = 32, serializations: int = 1) -> None:
        super().__init__(window=window, serializations=serializations)
        self._window = window
        self._lm_reset()

    def _lm_reset(self) -> None:
        self._lm_flight: dict[int, tuple[float, int]] = {}
        self._lm_delivered = 0
        self._lm_rates: deque[float] = deque(maxlen=self._window // 2)
        self._lm_line = RunningFit(self._window)
        # Two back-to-back completions in a row: their mean service (``rate_and_cost(collective=True)``)
        self._lm_pairs = RunningFit(self._window)
        self._lm_pair_from: tuple[float, int] | None = None  # the last sample's (gap start, bytes)
        self._lm_latency: deque[float] = deque(maxlen=self._window // 2)
        self._lm_last_finish = float("-inf")
        self._lm_fit_at = -1
        self._lm_fit: tuple[float, float] | None = None
        self._lm_shift = 0  # signed length of the current run of samples off the fit in one direction
        self.samples = 0
        self.shifts = 0  # link changes detected

    # -- events ---------------------------------------------------------------------------------------
    def on_send(self, task, now: float) -> None:
        self._lm_flight[id(task)] = (now, self._lm_delivered)

    def on_finish(self, task, now: float) -> None:
        sent_at, delivered_at_send = self._lm_flight.pop(id(task), (None, 0))
        self._lm_delivered += task.nbytes
        last, self._lm_last_finish = self._lm_last_finish, now
        if sent_at is None or now <= sent_at:
            return
        self._lm_rates.append((self._lm_delivered - delivered_at_send) / (now - sent_at))
        self.samples += 1
        if sent_at < last < now:  # queued behind the previous op: the gap is this op's service
            # (on a link of several FIFO stages, back-to-back completions are one stage's service apart)
            self._follow_shift(float(task.nbytes), now - last)  # judged against the fit before it
            self._lm_line.add(float(task.nbytes), now - last)
            self._lm_fit_at = -1  # that fit is cached under this completion's count: refit with the sample
            if self._lm_pair_from is not None:
                before, nbytes = self._lm_pair_from
                self._lm_pairs.add((nbytes + task.nbytes) / 2, (now - before) / 2)
            self._lm_pair_from = (last, task.nbytes)
        else:
            self._lm_pair_from = None
            rate = self.bytes_per_s
            if rate:
                self._lm_latency.append(max(0.0, (now - sent_at) - self.serializations * task.nbytes / rate))

    def _follow_shift(self, nbytes: float, service: float) -> None:
        fit = self._fit()
        if fit is None or fit[1] * nbytes < fit[0]:  # no line yet, or a sample of mostly per-message cost
            return
        ratio = service / (fit[0] + fit[1] * nbytes)
        step = 1 if ratio > SHIFT_RATIO else -1 if ratio < 1 / SHIFT_RATIO else 0
        run = self._lm_shift
        if step == 0:
            run = 0
        elif run * step > 0:
            run += step
        else:
            run = step
        self._lm_shift = run
        if abs(run) >= SHIFT_RUN:  # this sample and the SHIFT_RUN - 1 before it: the link changed
            keep = SHIFT_RUN - 1
            self._lm_line.keep_last(keep)
            self._lm_pairs.keep_last(keep)
            rates = list(self._lm_rates)[-SHIFT_RUN:]
            self._lm_rates.clear()
            self._lm_rates.extend(rates)
            self._lm_shift = 0
            self.shifts += 1

    # -- estimates ------------------------------------------------------------------------------------
    def _fit(self):
        if self._lm_fit_at == self.samples:
            return self._lm_fit
        self._lm_fit_at = self.samples
        self._lm_fit = self._lm_line.fit(flat_through_origin=True)
        pts = self._lm_line.samples
        if len(pts) < MIN_FIT_SAMPLES and self.shifts and pts:
            # Just after a detected change, the few samples kept are the best evidence of the new link:
            # a line through the origin, never the peak delivery rate alone (one op sent just before a
            # burst of completions "delivers" gigabytes per second).
            sx, sy = sum(x for x, _ in pts), sum(y for _, y in pts)
            if sx > 0 and sy > 0:
                self._lm_fit = (0.0, sy / sx)
        return self._lm_fit

    @property
    def known(self) -> bool:
        return bool(self._lm_rates)

    @property
    def bytes_per_s(self) -> float | None:
        return self.rate_and_cost()[0]

    @property
    def message_cost(self) -> float:
        return self.rate_and_cost()[1]

    def rate_and_cost(self, collective: bool = False) -> tuple[float | None, float]:
        """``(bytes_per_s, message_cost)``. With ``collective`` (Prophet's fused collectives), the cost
        is calibrate's (``calibrate.fit.fit_link``: the intercept of the line through back-to-back
        services, each averaged over consecutive completions) instead of the low quantile below:
        gloo runs two collectives at once and completes them in pairs, so every other back-to-back
        gap is nearly 0, and that quantile, and a line through single gaps, read 0 or little
        (docs/DESIGN.md, "Fused collectives", "The cost fusion reads")."""
        fit = self._fit()
        peak = max(self._lm_rates) if self._lm_rates else None
        if fit is None:
            return peak, 0.0
        rate = 1.0 / fit[1]
        # a back-to-back gap can be shortened by an op that overlapped the previous one (several
        # collectives run at once): never believe more than the best delivery rate seen
        if peak is not None and rate > peak:
            rate = peak
        # The cost the link serialises is at most the smallest overhead seen between back-to-back
        # completions: with one or two ops in flight a gap still holds the rest of the next op's
        # start-up latency, and a cost fitted through those gaps would keep the ops few and the
        # latency exposed, a feedback loop (docs/DESIGN.md, "Link monitor (plugins)"). A low quantile
        # of the residuals breaks it.
        if collective:
            pairs = self._lm_pairs.fit(flat_through_origin=True)
            if pairs is None:
                return rate, 0.0
            return (min(1.0 / pairs[1], peak) if peak is not None else 1.0 / pairs[1]), pairs[0]
        slope = fit[1]
        residuals = sorted(max(0.0, y - x * slope) for x, y in self._lm_line.samples)
        cost = residuals[len(residuals) // 10] if residuals else 0.0
        return rate, min(cost, fit[0])

    @property
    def latency(self) -> float:
        """Median start-up latency of an op sent onto an idle link (seconds; 0 until measured)."""
        return statistics.median(self._lm_latency) if self._lm_latency else 0.0

    @property
    def in_flight_count(self) -> int:
        return len(self._lm_flight)

    def reset(self) -> None:
        self._lm_reset()


def link_monitor(settings: Settings, stages: int) -> LinkMonitor | None:
    """A :class:`LinkMonitor` for a real backend's scheduler, or None (the core's monitor, each
    completion an exact sample, as in the ideal simulator) with ``BYTEPS_PROPHET_LINK=core``."""
    return LinkMonitor(serializations=stages) if settings.link_monitor == "measured" else None
