"""One validated settings object, read from the environment once at start.

Everything else receives a ``Settings``; nothing below the plugins reads ``os.environ`` itself.
Invalid values raise ``ConfigError`` with a one-line message naming the variable and what is valid.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Mapping

from byteps_prophet.errors import ConfigError

SCHEDULERS = ("fifo", "bytescheduler", "prophet")
PROPHET_MODES = ("default", "paper")

DEFAULT_PARTITION = 1_000_000  # elements, as in ByteScheduler
DEFAULT_CREDIT = 4_000_000  # elements, as in ByteScheduler


@dataclasses.dataclass(frozen=True)
class Settings:
    scheduler: str = "fifo"
    # ByteScheduler (units are elements, as in the original).
    partition: int = DEFAULT_PARTITION
    credit: int = DEFAULT_CREDIT
    credit_tuning: bool = False
    # Prophet.
    prophet_mode: str = "default"
    boundary_factor: float = 2.0  # a gap is a step boundary when > factor x mean gap
    profile_iterations: int = 3  # iterations whose ready times make one profile (median per gradient)
    drift_tolerance: float = 0.25  # re-profile when the pattern or bandwidth moves by more than this
    min_chunk_bytes: int = 0  # 0 = derive from measured per-message cost and bandwidth
    max_chunk_bytes: int = 0  # 0 = no cap (2 MiB where pulls follow pushes: core/prophet.py)

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise ConfigError(
                f"BYTEPS_SCHEDULER={self.scheduler!r} is not a scheduler; valid: {', '.join(SCHEDULERS)}"
            )
        if self.prophet_mode not in PROPHET_MODES:
            raise ConfigError(
                f"PROPHET_MODE={self.prophet_mode!r} is not a mode; valid: {', '.join(PROPHET_MODES)}"
            )
        _require(self.partition > 0, "BYTESCHEDULER_PARTITION", self.partition, "a positive integer (elements)")
        _require(self.credit > 0, "BYTESCHEDULER_CREDIT", self.credit, "a positive integer (elements)")
        _require(self.boundary_factor > 1, "PROPHET_BOUNDARY_FACTOR", self.boundary_factor, "a number > 1")
        _require(self.profile_iterations >= 1, "PROPHET_PROFILE_ITERATIONS", self.profile_iterations, "an integer >= 1")
        _require(0 < self.drift_tolerance < 10, "PROPHET_DRIFT_TOLERANCE", self.drift_tolerance, "a number in (0, 10)")
        _require(self.min_chunk_bytes >= 0, "PROPHET_MIN_CHUNK_BYTES", self.min_chunk_bytes, "an integer >= 0")
        _require(self.max_chunk_bytes >= 0, "PROPHET_MAX_CHUNK_BYTES", self.max_chunk_bytes, "an integer >= 0")

    def replace(self, **changes) -> "Settings":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if environ is None else environ
        return cls(
            scheduler=env.get("BYTEPS_SCHEDULER", "fifo").strip().lower() or "fifo",
            partition=_parse(env, "BYTESCHEDULER_PARTITION", int, DEFAULT_PARTITION, "a positive integer (elements)"),
            credit=_parse(env, "BYTESCHEDULER_CREDIT", int, DEFAULT_CREDIT, "a positive integer (elements)"),
            credit_tuning=_parse_bool(env, "BYTESCHEDULER_CREDIT_TUNING", False),
            prophet_mode=env.get("PROPHET_MODE", "default").strip().lower() or "default",
            boundary_factor=_parse(env, "PROPHET_BOUNDARY_FACTOR", float, 2.0, "a number > 1"),
            profile_iterations=_parse(env, "PROPHET_PROFILE_ITERATIONS", int, 3, "an integer >= 1"),
            drift_tolerance=_parse(env, "PROPHET_DRIFT_TOLERANCE", float, 0.25, "a number in (0, 10)"),
            min_chunk_bytes=_parse(env, "PROPHET_MIN_CHUNK_BYTES", int, 0, "an integer >= 0"),
            max_chunk_bytes=_parse(env, "PROPHET_MAX_CHUNK_BYTES", int, 0, "an integer >= 0"),
        )


def _require(ok: bool, name: str, value, valid: str) -> None:
    if not ok:
        raise ConfigError(f"{name}={value!r} is invalid; valid: {valid}")


def elements_from_env(name: str, default: int, environ: Mapping[str, str] | None = None) -> int:
    """A positive element count from ``name`` (``default`` when unset); anything else is one-line
    ConfigError naming it (the engines' atom sizes)."""
    env = os.environ if environ is None else environ
    value = _parse(env, name, int, default, "a positive integer (elements)")
    _require(value > 0, name, value, "a positive integer (elements)")
    return value


def _parse(env: Mapping[str, str], name: str, kind, default, valid: str):
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return kind(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number; valid: {valid}") from None


def _parse_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean; valid: 0, 1")
