"""Bandwidth and latency strings in tc's units: ``1gbit``, ``200mbit``, ``10Gbit``, ``500kbit``, ``1ms``.

Both parsers insist on a unit (tc would read a bare ``100`` as 100 bit/s or 100 us, which is never what
someone typing it meant) and raise :class:`ConfigError` naming the bad value and the valid units.
"""
from __future__ import annotations

import re

from byteps_prophet.errors import ConfigError

# tc-bandwidth(8): SI units are powers of 1000, IEC units powers of 1024; "bps" units are BYTES/s.
_BIT_UNITS = {
    "bit": 1,
    "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12,
    "kibit": 2**10, "mibit": 2**20, "gibit": 2**30, "tibit": 2**40,
    "bps": 8,
    "kbps": 8 * 10**3, "mbps": 8 * 10**6, "gbps": 8 * 10**9, "tbps": 8 * 10**12,
    "kibps": 8 * 2**10, "mibps": 8 * 2**20, "gibps": 8 * 2**30, "tibps": 8 * 2**40,
}
# tc-bandwidth(8) "TIME": s, sec, secs, ms, msec, msecs, us, usec, usecs.
_TIME_UNITS_US = {
    "s": 1_000_000, "sec": 1_000_000, "secs": 1_000_000,
    "ms": 1_000, "msec": 1_000, "msecs": 1_000,
    "us": 1, "usec": 1, "usecs": 1,
}
_NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]*)\s*$")
_UNLIMITED = {"", "none", "unlimited", "off"}
_MAX_RATE_BITS = 100 * 10**12  # far above anything tbf can shape on one machine

BANDWIDTH_UNITS_HELP = "bit, kbit, mbit, gbit, tbit, kibit..tibit, or bps, kbps, mbps, gbps (bytes/s)"
LATENCY_UNITS_HELP = "s, ms, us (also sec, msec, usec)"


def parse_bandwidth(text: str | int | None, what: str = "bandwidth") -> int | None:
    """``'1gbit'`` -> 1_000_000_000 (bits per second). ``None``/``'none'``/``'unlimited'`` -> None."""
    if text is None:
        return None
    if isinstance(text, bool):
        raise ConfigError(f"{what} {text!r} is not a rate; use e.g. 1gbit, 200mbit ({BANDWIDTH_UNITS_HELP})")
    if isinstance(text, int):
        if text <= 0:
            raise ConfigError(f"{what} {text} must be positive bits per second")
        return text
    raw = str(text)
    if raw.strip().lower() in _UNLIMITED:
        return None
    match = _NUMBER.match(raw)
    if not match:
        raise ConfigError(f"{what} {raw!r} is not a rate; use e.g. 1gbit, 200mbit, 10Gbit, 500kbit "
                          f"(units: {BANDWIDTH_UNITS_HELP}) or 'none'")
    number, unit = float(match.group(1)), match.group(2).lower()
    if not unit:
        raise ConfigError(f"{what} {raw!r} has no unit; write e.g. {match.group(1)}mbit "
                          f"(units: {BANDWIDTH_UNITS_HELP})")
    if unit not in _BIT_UNITS:
        raise ConfigError(f"{what} {raw!r} has unknown unit {match.group(2)!r}; valid units: "
                          f"{BANDWIDTH_UNITS_HELP}")
    bits = round(number * _BIT_UNITS[unit])
    if bits < 8:
        raise ConfigError(f"{what} {raw!r} must be at least 8bit (one byte per second)")
    if bits > _MAX_RATE_BITS:
        raise ConfigError(f"{what} {raw!r} is above the 100tbit limit")
    return bits


def parse_latency(text: str | float | None, what: str = "latency") -> int:
    """``'1ms'`` -> 1000 (microseconds). ``None``/``'0'``/``'none'`` -> 0."""
    if text is None:
        return 0
    if isinstance(text, bool):
        raise ConfigError(f"{what} {text!r} is not a time; use e.g. 1ms, 500us ({LATENCY_UNITS_HELP})")
    if isinstance(text, (int, float)):
        if text < 0:
            raise ConfigError(f"{what} {text} must not be negative")
        return round(text)
    raw = str(text)
    if raw.strip().lower() in _UNLIMITED:
        return 0
    match = _NUMBER.match(raw)
    if not match:
        raise ConfigError(f"{what} {raw!r} is not a time; use e.g. 1ms, 500us (units: {LATENCY_UNITS_HELP})")
    number, unit = float(match.group(1)), match.group(2).lower()
    if not unit:
        if number == 0:
            return 0
        raise ConfigError(f"{what} {raw!r} has no unit; write e.g. {match.group(1)}ms "
                          f"(units: {LATENCY_UNITS_HELP})")
    if unit not in _TIME_UNITS_US:
        raise ConfigError(f"{what} {raw!r} has unknown unit {match.group(2)!r}; valid units: "
                          f"{LATENCY_UNITS_HELP}")
    micros = number * _TIME_UNITS_US[unit]
    if micros > 60 * 1_000_000:
        raise ConfigError(f"{what} {raw!r} is above the 60s limit")
    return round(micros)


def format_bandwidth(bits: int | None) -> str:
    """1_000_000_000 -> '1gbit'; None -> 'unlimited'. Exact (falls back to plain 'bit')."""
    if bits is None:
        return "unlimited"
    for unit, scale in (("tbit", 10**12), ("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits >= scale and bits % scale == 0:
            return f"{bits // scale}{unit}"
    return f"{bits}bit"


def format_latency(micros: int) -> str:
    if micros and micros % 1000 == 0:
        return f"{micros // 1000}ms"
    return f"{micros}us"
