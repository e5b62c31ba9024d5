"""What an A/B's rounds can say: each round's paired ratio of two variants, and how sure their median is.

Rounds are interleaved, so a ratio of two variants within one round cancels the machine's drift; the
median of those ratios is the A/B's speedup. Its interval comes from the sign test: the k-th smallest
and k-th largest of n ratios enclose the true median with probability 1 - 2 P(Binomial(n, 1/2) < k),
whatever the ratios' distribution (no normality, no resampling: the same rounds give the same interval).
Five rounds or fewer cannot reach 95%; the interval is then their whole range, with the probability it
does have. What a speedup may be called follows from its interval by one rule (``verdict``).
"""
from __future__ import annotations

import math
import statistics

LEVEL = 0.95
LEVEL_BAND = 0.05  # an interval within 1 +- this, at LEVEL, says "level"


def paired_ratios(runs: list[dict], a: str, b: str) -> list[float]:
    """``a``'s samples/s over ``b``'s, one per round that ran both, in round order."""
    by_round: dict[int, dict[str, float]] = {}
    for run in runs:
        by_round.setdefault(run["round"], {}).setdefault(run["variant"], run["samples_per_s"])
    return [rates[a] / rates[b] for _, rates in sorted(by_round.items()) if a in rates and b in rates]


def median_interval(values: list[float], level: float = LEVEL) -> tuple[float, float, float]:
    """``(low, high, confidence)``: the narrowest order-statistic interval that encloses the median of
    the distribution ``values`` were drawn from with probability at least ``level``, or, when there are
    too few values for that, their whole range and the probability it encloses the median."""
    xs = sorted(values)
    n = len(xs)
    if not n:
        raise ValueError("median_interval of no values")

    # [x_(k), x_(n+1-k)] misses the median with probability 2 P(Binomial(n, 1/2) < k); exact integers,
    # since 2^n overflows a float past about a thousand rounds
    total = 1 << n
    k, below = 1, 1  # below = the number of outcomes with fewer than k values under the median
    while k < (n + 1) // 2:
        wider = below + math.comb(n, k)
        if 1 - 2 * wider / total < level:
            break
        k, below = k + 1, wider
    return xs[k - 1], xs[n - k], 1 - 2 * below / total


def speedup(ratios: list[float], of_medians: float) -> dict:
    """The A/B's summary of one pair of variants (``speedups`` in its JSON)."""
    low, high, confidence = median_interval(ratios)
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "of_medians": of_medians, "rounds": len(ratios),
            "interval": {"low": low, "high": high, "confidence": confidence}}


def verdict(low: float, high: float, confidence: float) -> str:
    """What a speedup's interval lets one call it: "win" only where the interval, at ``LEVEL`` or more,
    lies above 1, "loss" where it lies below 1, "level" where it lies within 1 +- ``LEVEL_BAND``, and
    "not settled" otherwise (always below ``LEVEL``: too few rounds)."""
    if confidence < LEVEL:
        return "not settled"
    if low > 1:
        return "win"
    if high < 1:
        return "loss"
    if low >= 1 - LEVEL_BAND and high <= 1 + LEVEL_BAND:
        return "level"
    return "not settled"
