"""One validated settings object, read from the environment once at start.

Everything else receives a ``Settings``; nothing below the plugins reads ``os.environ`` itself.
Invalid values raise ``ConfigError`` with a one-line message naming the variable and what is valid.
The knobs the patched engine reads itself (``PS_ZMQ_IDLE_US``, ``BYTEPS_LOOP_IDLE_US``) are fields too,
so a bad value fails here, before an engine starts. Where a process sits in the job is not a setting:
``backends/rendezvous.py`` reads it; a cluster container's job is ``cluster/container.py``'s.
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
PATHS = ("trace", "profile", "socket_path")

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
    # layer-wise overlap: step() returns before every update landed, a forward waits only for its own
    # layer's; off, step() returns with every parameter updated, as stock BytePS (docs/DESIGN.md)
    overlap: bool = False
    layerwise: bool = True  # per-parameter update as each gradient is synchronised
    # Prophet's fused collectives on all-reduce (docs/DESIGN.md, "Fused collectives"), in the plugins and
    # the simulator alike; on: 1.29x over unfused on 4-worker gloo, 6 rounds pooled (docs/DESIGN.md, the decision)
    fuse: bool = True
    # Diagnostics.
    trace: str = ""  # PATH ({rank} replaced): each rank's events as Chrome trace JSON (core/trace.py); "" = none
    profile: str = ""  # PATH ({rank} replaced): the recorded profile (docs/PROFILE.md); "" = none
    # Every backend: how long a rank waits for its peers to connect or answer before it fails.
    timeout: float = 300.0
    # Read by the patched engine itself (patch 0011), validated here so a typo fails in one line
    # instead of the engine's atoll reading it as 0: the longest idle sleep, microseconds.
    zmq_idle_us: int = 1000  # ps-lite receive threads, every role; 0 = spin
    loop_idle_us: int = 1000  # BytePS's core loops; 1 = the unpatched 1 us sleep
    # BytePS-MXNet's socket directory; "" = a private temporary one (backends/byteps_ps.py)
    socket_path: str = ""

    def __post_init__(self) -> None:
        """Each field in its range, else a one-line ConfigError naming its variable and what is valid."""
        ok = {"scheduler": self.scheduler in SCHEDULERS, "prophet_mode": self.prophet_mode in PROPHET_MODES,
              "partition": self.partition > 0, "credit": self.credit > 0,
              "boundary_factor": self.boundary_factor > 1, "profile_iterations": self.profile_iterations >= 1,
              "drift_tolerance": 0 < self.drift_tolerance < 10, "min_chunk_bytes": self.min_chunk_bytes >= 0,
              "max_chunk_bytes": self.max_chunk_bytes >= 0, "atom_elements": self.atom_elements >= 0,
              "link_monitor": self.link_monitor in LINK_MONITORS, "prophet_partition": self.prophet_partition >= -1,
              "backend": self.backend in ("", *BACKENDS), "timeout": self.timeout > 0,
              "zmq_idle_us": self.zmq_idle_us >= 0, "loop_idle_us": self.loop_idle_us >= 1}
        for field, good in ok.items():
            if not good:
                name, valid = ENVIRONMENT[field]
                what = {"scheduler": "is not a scheduler", "prophet_mode": "is not a mode"}.get(field, "is invalid")
                raise ConfigError(f"{name}={getattr(self, field)!r} {what}; valid: {valid}")

    def replace(self, **changes) -> "Settings":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None,
                 overrides: Mapping[str, object] | None = None) -> "Settings":
        """Each field from its variable in ``ENVIRONMENT`` (unset or empty: the default); a field named
        in ``overrides`` (keyword arguments a user passed, e.g. to ``DistributedOptimizer``) takes that
        value instead. An unknown name in ``overrides`` is a one-line ConfigError."""
        unknown = sorted(set(overrides or ()) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ConfigError(f"{unknown[0]!r} is not a setting; valid: "
                              f"{', '.join(f.name for f in dataclasses.fields(cls))}")
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
        values.update(overrides or {})
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
    "atom_elements": ("BYTEPS_PROPHET_ATOM_ELEMENTS", "an integer >= 0 (elements; 0 = the engine's default)"),
    "link_monitor": ("BYTEPS_PROPHET_LINK", ", ".join(LINK_MONITORS)),
    "prophet_partition": ("BYTEPS_PROPHET_PARTITION", "an integer >= 0 (elements; 0 = BYTESCHEDULER_PARTITION)"),
    "backend": ("BYTEPS_PROPHET_BACKEND", ", ".join(BACKENDS)),
    "overlap": ("BYTEPS_PROPHET_OVERLAP", "0, 1"),
    "layerwise": ("BYTEPS_PROPHET_LAYERWISE", "0, 1"),
    "fuse": ("BYTEPS_PROPHET_FUSE", "0, 1"),
    "trace": ("BYTEPS_PROPHET_TRACE", "a file path ({rank} is replaced by the rank)"),
    "profile": ("BYTEPS_PROPHET_PROFILE", "a file path ({rank} is replaced by the rank)"),
    "timeout": ("BYTEPS_PROPHET_TIMEOUT", "a positive number of seconds"),
    "zmq_idle_us": ("PS_ZMQ_IDLE_US", "an integer >= 0 (microseconds; 0 = spin)"),
    "loop_idle_us": ("BYTEPS_LOOP_IDLE_US", "an integer >= 1 (microseconds; 1 = the unpatched loop)"),
    "socket_path": ("BYTEPS_SOCKET_PATH", "a directory path"),
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
