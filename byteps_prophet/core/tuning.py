"""Credit auto-tuning as ByteScheduler does it: Bayesian optimisation of the credit.

10 random probes, then 4 expected-improvement probes (a Gaussian process from the maintained
``bayesian-optimization`` package), each scored by the mean step time the caller measured with that
credit; then the best credit seen is kept. The search runs over log2(credit), so the bounds' decades
get equal attention (the original searched linearly; log space needs fewer probes for the same
coverage of small credits).
"""
from __future__ import annotations

import math
import warnings
from typing import Callable

import numpy as np

from byteps_prophet.core.clock import Clock, MonotonicClock

PS_BOUNDS = (1_000_000, 16_000_000)  # elements
ALLREDUCE_BOUNDS = (4_000_000, 64_000_000)


class CreditTuner:
    def __init__(self, bounds: tuple[int, int] = PS_BOUNDS, random_probes: int = 10,
                 guided_probes: int = 4, seed: int = 0) -> None:
        from bayes_opt import BayesianOptimization, UtilityFunction

        lo, hi = bounds
        if not 0 < lo < hi:
            raise ValueError(f"credit bounds must satisfy 0 < low < high, got {bounds}")
        self._space = {"log2_credit": (math.log2(lo), math.log2(hi))}
        self._optimizer = BayesianOptimization(f=None, pbounds=self._space, verbose=0, random_state=seed,
                                               allow_duplicate_points=True)
        self._utility = UtilityFunction(kind="ei", xi=0.0)
        self._rng = np.random.RandomState(seed)
        self.random_probes = random_probes
        self.guided_probes = guided_probes
        self.history: list[tuple[int, float]] = []  # (credit, mean step seconds)

    @property
    def done(self) -> bool:
        return len(self.history) >= self.random_probes + self.guided_probes

    @property
    def best(self) -> int | None:
        return min(self.history, key=lambda h: h[1])[0] if self.history else None

    def suggest(self) -> int:
        """The next credit to try, or the best one once all probes are spent."""
        if self.done:
            return self.best
        if len(self.history) < self.random_probes:
            lo, hi = self._space["log2_credit"]
            log2_credit = self._rng.uniform(lo, hi)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                log2_credit = self._optimizer.suggest(self._utility)["log2_credit"]
        return int(round(2 ** log2_credit))

    def observe(self, credit: int, mean_step_s: float) -> None:
        self.history.append((credit, mean_step_s))
        # The optimiser maximises: score a credit by its negative step time.
        self._optimizer.register(params={"log2_credit": math.log2(credit)}, target=-mean_step_s)


def credit_bounds(partition: int, total_elements: int) -> tuple[int, int]:
    """What a tuning run on a real model searches: [partition / 4, the model's element count], at
    least 4x apart."""
    lo = max(partition // 4, 65_536)
    return lo, max(total_elements, 4 * lo)


def tune_credit(bounds: tuple[int, int], probes: tuple[int, int], probe_steps: int,
                set_credit: Callable[[int], None], step: Callable[[], None], sync: Callable[[], None],
                clock: Clock | None = None) -> dict:
    """The tuning run of the benchmarks: per probe, ``set_credit`` (the scheduling worker's; a no-op
    elsewhere), one transition step (not scored), then ``probe_steps`` steps scored by their mean time
    once everything is synchronised. Every worker runs the same steps."""
    clock = clock or MonotonicClock()
    tuner = CreditTuner(bounds, random_probes=probes[0], guided_probes=probes[1])
    history = []
    while not tuner.done:
        credit = tuner.suggest()
        set_credit(credit)
        step()
        sync()
        start = clock.now()
        for _ in range(probe_steps):
            step()
        sync()
        mean = (clock.now() - start) / probe_steps
        tuner.observe(credit, mean)
        history.append([credit, round(mean, 6)])
    return {"best_credit": tuner.best, "probes": history, "credit_bounds": list(bounds),
            "tune_probe_steps": probe_steps}
