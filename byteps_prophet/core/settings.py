"""One validated settings object, read from the environment once at start.

Everything else receives a ``Settings``; nothing below the plugins reads ``os.environ`` itself.
Invalid values raise ``ConfigError`` with a one-line message naming the variable and what is valid.
"""
from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Mapping

from byteps_prophet.errors import ConfigError

SCHEDULERS = ("fifo", "bytescheduler", "prophet")
PROPHET_MODES = ("default", "paper")
LINK_MONITORS = ("measured", "core")
BACKENDS = ("gloo", "nccl", "byteps", "local")  # the torch plugin's (backends.make_backend)
# Old names still read, with a warning, when the new one is unset: old -> new.
RENAMED = {"PROPHET_MXNET_ATOM_ELEMENTS": "BYTEPS_PROPHET_ATOM_ELEMENTS",
           "PROPHET_MXNET_TIMELINE": "BYTEPS_PROPHET_TRACE"}
# Fields whose value is a path: kept as written (other strings are names, read case-insensitively).
PATHS = ("trace", "profile")

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
    # Engine side (the plugins).
    atom_elements: int = 0  # Prophet's fixed atoms on BytePS and the MXNet stores; 0 = the engine's default
    link_monitor: str = "measured"  # how the plugins measure their link: LinkMonitor, or the core's monitor
    # Prophet's queued pieces in the torch plugin, elements; -1 = derived (torch/optimizer.py), 0 = the partition
    prophet_partition: int = -1
    # The torch plugin.
    backend: str = ""  # gloo, nccl, byteps, local; "" = from the process (torch.distributed, DMLC_ROLE, WORLD_SIZE)
    overlap: bool = True  # layer-wise overlap: a forward waits only for its own layer's update
    layerwise: bool = True  # per-parameter update as each gradient is synchronised
    # Prophet's fused collectives on all-reduce (docs/DESIGN.md, "Fused collectives"), in the plugins and
    # the simulator alike; on: 1.33x over unfused on 4-worker gloo (docs/DESIGN.md, the decision)
    fuse: bool = True
    # Diagnostics.
    trace: str = ""  # PATH ({rank} replaced): each rank's events as Chrome trace JSON (core/trace.py); "" = none
    profile: str = ""  # PATH ({rank} replaced): the recorded profile (docs/PROFILE.md); "" = none

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
        _require(self.atom_elements >= 0, "BYTEPS_PROPHET_ATOM_ELEMENTS", self.atom_elements,
                 "an integer >= 0 (elements; 0 = the engine's default)")
        _require(self.link_monitor in LINK_MONITORS, "BYTEPS_PROPHET_LINK", self.link_monitor,
                 ", ".join(LINK_MONITORS))
        _require(self.prophet_partition >= -1, "BYTEPS_PROPHET_PARTITION", self.prophet_partition,
                 ENVIRONMENT["prophet_partition"][1])
        _require(self.backend in ("", *BACKENDS), "BYTEPS_PROPHET_BACKEND", self.backend, ", ".join(BACKENDS))

    def replace(self, **changes) -> "Settings":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        """Each field from its variable in ``ENVIRONMENT`` (unset or empty: the default)."""
        env = _renamed(os.environ if environ is None else environ)
        values = {}
        for field in dataclasses.fields(cls):
            name, valid = ENVIRONMENT[field.name]
            raw = env.get(name)
            if raw is not None and raw.strip():
                values[field.name] = raw.strip() if field.name in PATHS else \
                    _convert(name, raw.strip(), type(field.default), valid)
        if env.get("BYTESCHEDULER_PARTITION", "").strip():
            values["prophet_partition"] = 0  # a partition set is Prophet's partition too (docs/PYTORCH.md)
        return cls(**values)


# Every field's variable, and what is valid (the README's settings table lists each, tests/test_settings.py).
ENVIRONMENT = {
    "scheduler": ("BYTEPS_SCHEDULER", ", ".join(SCHEDULERS)),
    "partition": ("BYTESCHEDULER_PARTITION", "a positive integer (elements)"),
    "credit": ("BYTESCHEDULER_CREDIT", "a positive integer (elements)"),
    "credit_tuning": ("BYTESCHEDULER_CREDIT_TUNING", "0, 1"),
    "prophet_mode": ("PROPHET_MODE", ", ".join(PROPHET_MODES)),
    "boundary_factor": ("PROPHET_BOUNDARY_FACTOR", "a number > 1"),
    "profile_iterations": ("PROPHET_PROFILE_ITERATIONS", "an integer >= 1"),
    "drift_tolerance": ("PROPHET_DRIFT_TOLERANCE", "a number in (0, 10)"),
    "min_chunk_bytes": ("PROPHET_MIN_CHUNK_BYTES", "an integer >= 0"),
    "max_chunk_bytes": ("PROPHET_MAX_CHUNK_BYTES", "an integer >= 0"),
    "atom_elements": ("BYTEPS_PROPHET_ATOM_ELEMENTS", "an integer >= 0 (elements)"),
    "link_monitor": ("BYTEPS_PROPHET_LINK", ", ".join(LINK_MONITORS)),
    "prophet_partition": ("BYTEPS_PROPHET_PARTITION", "an integer >= 0 (elements; 0 = BYTESCHEDULER_PARTITION)"),
    "backend": ("BYTEPS_PROPHET_BACKEND", ", ".join(BACKENDS)),
    "overlap": ("BYTEPS_PROPHET_OVERLAP", "0, 1"),
    "layerwise": ("BYTEPS_PROPHET_LAYERWISE", "0, 1"),
    "fuse": ("BYTEPS_PROPHET_FUSE", "0, 1"),
    "trace": ("BYTEPS_PROPHET_TRACE", "a file path ({rank} is replaced by the rank)"),
    "profile": ("BYTEPS_PROPHET_PROFILE", "a file path ({rank} is replaced by the rank)"),
}


def _convert(name: str, raw: str, kind: type, valid: str):
    if kind is bool:
        return _parse_bool({name: raw}, name, False)
    if kind is str:
        return raw.lower()
    return _parse({name: raw}, name, kind, None, valid)


def _renamed(env: Mapping[str, str]) -> Mapping[str, str]:
    """``env`` with each old name's value under its new name (where that is unset), with a warning."""
    old = [name for name in RENAMED if env.get(name, "").strip()]
    if not old:
        return env
    merged = dict(env)
    for name in old:
        new = RENAMED[name]
        warnings.warn(f"{name} is renamed {new}; the old name still works for now", FutureWarning, stacklevel=3)
        if not merged.get(new, "").strip():
            merged[new] = merged[name]
    return merged


def _require(ok: bool, name: str, value, valid: str) -> None:
    if not ok:
        raise ConfigError(f"{name}={value!r} is invalid; valid: {valid}")


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
