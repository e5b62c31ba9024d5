"""One validated settings object, read from the environment once at start.

Everything else receives a ``Settings``; nothing below the plugins reads ``os.environ`` itself.
Each setting is one declaration (``setting(...)`` below): its field, its variable, its default,
what is valid and what it means. The checks, ``from_env``, the README's settings table
(``markdown_table``, written by ``byteps-prophet settings --write-readme``) and the commands' help
(``settings_help``) are all read from those declarations. No setting changes another.
Invalid values raise ``ConfigError`` with a one-line message naming the variable and what is valid.
The knobs the patched engine reads itself (``PS_ZMQ_IDLE_US``, ``BYTEPS_LOOP_IDLE_US``) are fields too,
so a bad value fails here, before an engine starts. Where a process sits in the job is not a setting:
``backends/rendezvous.py`` reads it; a cluster container's job is ``cluster/container.py``'s.
"""
from __future__ import annotations

import dataclasses
import os
import textwrap
import warnings
from typing import Callable, Iterable, Mapping

from byteps_prophet.errors import ConfigError

SCHEDULERS = ("fifo", "bytescheduler", "prophet")
PROPHET_MODES = ("default", "paper")
LINK_MONITORS = ("measured", "core")
BACKENDS = ("gloo", "nccl", "byteps", "local")  # the torch plugin's (backends.make_backend)

DEFAULT_PARTITION = 1_000_000  # elements, as in ByteScheduler
DEFAULT_CREDIT = 4_000_000  # elements, as in ByteScheduler

MARKDOWN_WIDTH = 116  # docs keep lines under 120 characters (tests/test_docs.py)
README_START = "<!-- settings-table:start -->"
README_END = "<!-- settings-table:end -->"


@dataclasses.dataclass(frozen=True)
class Declaration:
    """One setting: its environment variable, what is valid (the check and its text), what it means."""

    variable: str
    valid: str
    meaning: str
    check: Callable[[object], bool] = lambda value: True
    complaint: str = "is invalid"  # the error's verb phrase: "BYTEPS_SCHEDULER='x' is not a scheduler"
    path: bool = False  # a path is kept as written; other strings are names, read case-insensitively
    old_name: str = ""  # a former variable, still read (with a warning) while this one is unset
    default_text: str = ""  # the default as the table shows it, where the value alone would mislead


def setting(variable: str, default, valid: str, meaning: str, **declaration) -> dataclasses.Field:
    """A ``Settings`` field and its declaration (``Declaration``'s other fields as keywords)."""
    return dataclasses.field(default=default,
                             metadata={"setting": Declaration(variable, valid, meaning, **declaration)})


_PATH_VALID = "a file path ({rank} is replaced by the rank)"
_BOOL_VALID = "0, 1"


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every setting, each a field declared once (``setting``): the declarations are what make the class
    long; its logic is ``__post_init__`` (the checks) and ``from_env``."""

    scheduler: str = setting(
        "BYTEPS_SCHEDULER", "fifo", ", ".join(SCHEDULERS),
        "the scheduler: `fifo` (stock behaviour), `bytescheduler` or `prophet`",
        check=lambda v: v in SCHEDULERS, complaint="is not a scheduler")
    # ByteScheduler (units are elements, as in the original).
    partition: int = setting(
        "BYTESCHEDULER_PARTITION", DEFAULT_PARTITION, "a positive integer (elements)",
        "ByteScheduler's largest partition, elements (Prophet's queued pieces: `BYTEPS_PROPHET_PARTITION`)",
        check=lambda v: v > 0)
    credit: int = setting(
        "BYTESCHEDULER_CREDIT", DEFAULT_CREDIT, "a positive integer (elements)",
        "credit, elements (also bounds what Prophet has in flight on the parameter servers (torch/BytePS, "
        "both MXNet stores), where pulls follow pushes; there Prophet keeps at most one chunk per link stage "
        "in flight, or the link's rate times its start-up latency if more: docs/DESIGN.md, \"Flight window\")",
        check=lambda v: v > 0)
    credit_tuning: bool = setting(
        "BYTESCHEDULER_CREDIT_TUNING", False, _BOOL_VALID,
        "1: tune the credit online by Bayesian optimisation (the original's default; off here so runs are "
        "reproducible)")
    # Prophet.
    prophet_mode: str = setting(
        "PROPHET_MODE", "default", ", ".join(PROPHET_MODES),
        "`default` (work-conserving prediction) or `paper` (the ICPP'21 rule, for reproduction)",
        check=lambda v: v in PROPHET_MODES, complaint="is not a mode")
    boundary_factor: float = setting(
        "PROPHET_BOUNDARY_FACTOR", 2.0, "a number > 1",
        "a gap is a step boundary when larger than this times the mean gap",
        check=lambda v: v > 1)
    profile_iterations: int = setting(
        "PROPHET_PROFILE_ITERATIONS", 3, "an integer >= 1",
        "iterations whose ready times make one profile (per-gradient median)",
        check=lambda v: v >= 1)
    drift_tolerance: float = setting(
        "PROPHET_DRIFT_TOLERANCE", 0.25, "a number in (0, 10)",
        "re-profile after that many iterations whose pattern or bandwidth moved by more than this",
        check=lambda v: 0 < v < 10)
    min_chunk_bytes: int = setting(
        "PROPHET_MIN_CHUNK_BYTES", 0, "an integer >= 0",
        "chunk floor of the default mode, bytes; 0 = derived from the measured per-message cost and bandwidth",
        check=lambda v: v >= 0, default_text="0 (derived)")
    max_chunk_bytes: int = setting(
        "PROPHET_MAX_CHUNK_BYTES", 0, "an integer >= 0",
        "chunk cap of the default mode, bytes; 0 = no cap, except 2 MiB on the parameter servers "
        "(torch/BytePS, both MXNet stores), where pulls follow pushes: docs/DESIGN.md, \"2 MiB trailing chunks\"",
        check=lambda v: v >= 0, default_text="0 (no cap)")
    # Engine side (the plugins).
    atom_elements: int = setting(
        "BYTEPS_PROPHET_ATOM_ELEMENTS", 0, "an integer >= 0 (elements; 0 = the engine's default)",
        "Prophet's fixed atoms on BytePS and the MXNet stores (docs/DESIGN.md, \"Fixed atoms\")",
        check=lambda v: v >= 0, old_name="PROPHET_MXNET_ATOM_ELEMENTS",
        default_text="0 (the engine's: 250000 on torch/BytePS and the KVStore, the partition on BytePS-MXNet)")
    link_monitor: str = setting(
        "BYTEPS_PROPHET_LINK", "measured", ", ".join(LINK_MONITORS),
        "how the plugins measure their link: `measured` (LinkMonitor: start-up latency apart from the link's "
        "cost) or `core` (each completion an exact sample)",
        check=lambda v: v in LINK_MONITORS)
    prophet_partition: int = setting(
        "BYTEPS_PROPHET_PARTITION", -1,
        "-1 (derived), 0 (BYTESCHEDULER_PARTITION) or a positive integer (elements)",
        "torch plugin: elements per piece Prophet queues (it cuts its own chunks from them); -1 = derived "
        "(4000000 on all-reduce, `BYTESCHEDULER_PARTITION` on BytePS), 0 = `BYTESCHEDULER_PARTITION` "
        "(docs/PYTORCH.md)",
        check=lambda v: v >= -1, default_text="-1 (derived)")
    # The torch plugin.
    backend: str = setting(
        "BYTEPS_PROPHET_BACKEND", "", ", ".join(BACKENDS),
        "torch plugin: `gloo`, `nccl`, `byteps` or `local`; unset: an initialised torch.distributed group's, "
        "`byteps` for a BytePS worker (`DMLC_ROLE=worker`), `gloo` when `WORLD_SIZE` > 1, else `local`",
        check=lambda v: v in ("", *BACKENDS), default_text="from the process")
    overlap: bool = setting(
        "BYTEPS_PROPHET_OVERLAP", False, _BOOL_VALID,
        "torch plugin: 1 turns layer-wise overlap on: `step()` returns before every update landed and each "
        "module's next forward waits for its own; parameters read any other way may be one update behind "
        "(docs/PYTORCH.md). 0: `step()` returns with every parameter updated, as stock BytePS's")
    layerwise: bool = setting(
        "BYTEPS_PROPHET_LAYERWISE", True, _BOOL_VALID,
        "torch plugin: 0 disables the per-parameter update (`step()` waits for every gradient, then steps "
        "the whole optimizer at once)")
    fuse: bool = setting(
        "BYTEPS_PROPHET_FUSE", True, _BOOL_VALID,
        "all-reduce (torch plugin on gloo/NCCL, and the simulator): Prophet sends the most urgent pending "
        "pieces as one all_reduce (docs/DESIGN.md, \"Fused collectives\"); 0 turns it off. Never applies on "
        "parameter servers")
    # Diagnostics.
    trace: str = setting(
        "BYTEPS_PROPHET_TRACE", "", _PATH_VALID,
        "PATH: each rank's events (gradients ready, sends, forward waits, Prophet's planned iterations) as "
        "Chrome trace JSON, both frameworks; open it in ui.perfetto.dev or chrome://tracing (docs/PYTORCH.md, "
        "\"Trace\"). `{rank}` is replaced; without it rank 0 (the leader) writes PATH and the others "
        "`<stem>.rank<N>.json`", path=True, old_name="PROPHET_MXNET_TIMELINE")
    profile: str = setting(
        "BYTEPS_PROPHET_PROFILE", "", _PATH_VALID,
        "PATH: the recorded profile for `simulate --profile` (docs/PROFILE.md), both frameworks; `{rank}` is "
        "replaced, without it rank 0 writes", path=True)
    timeout: float = setting(
        "BYTEPS_PROPHET_TIMEOUT", 300.0, "a positive number of seconds",
        "seconds a rank waits for its peers to connect or answer before it fails, naming what it waited for "
        "(every backend)",
        check=lambda v: v > 0, default_text="300")
    # Read by the patched engine itself (patch 0011), validated here so a typo fails in one line
    # instead of the engine's atoll reading it as 0.
    zmq_idle_us: int = setting(
        "PS_ZMQ_IDLE_US", 1000, "an integer >= 0 (microseconds; 0 = spin)",
        "read by the patched engine (patch 0011, docs/BYTEPS.md): the longest sleep of ps-lite's idle receive "
        "threads, µs; 0 = spin. Checked here, passed to every cluster role",
        check=lambda v: v >= 0)
    loop_idle_us: int = setting(
        "BYTEPS_LOOP_IDLE_US", 1000, "an integer >= 1 (microseconds; 1 = the unpatched loop)",
        "read by the patched engine (patch 0011): the longest sleep of BytePS's idle core loops, µs; 1 = the "
        "unpatched loop",
        check=lambda v: v >= 1)
    socket_path: str = setting(
        "BYTEPS_SOCKET_PATH", "", "a directory path",
        "BytePS's socket directory; unset: a private temporary one for BytePS-MXNet, removed at shutdown",
        path=True)

    def __post_init__(self) -> None:
        """Each field in its range, else a one-line ConfigError naming its variable and what is valid."""
        for field, declaration in DECLARATIONS.items():
            _check(declaration, getattr(self, field), declaration.variable)

    def replace(self, **changes) -> "Settings":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None,
                 overrides: Mapping[str, object] | None = None) -> "Settings":
        """Each field from its variable (unset or empty: the default); a field named in ``overrides``
        (keyword arguments a user passed, e.g. to ``DistributedOptimizer``) takes that value instead.
        An unknown name in ``overrides``, or an invalid value, is a one-line ConfigError naming the
        keyword as written."""
        overrides = dict(overrides or {})
        unknown = sorted(set(overrides) - set(DECLARATIONS))
        if unknown:
            raise ConfigError(f"{unknown[0]!r} is not a setting; valid: {', '.join(DECLARATIONS)}")
        for field, value in overrides.items():
            _check(DECLARATIONS[field], value, field, kind=type(_DEFAULTS[field]))
        env = _renamed(os.environ if environ is None else environ)
        values = {}
        for field in dataclasses.fields(cls):
            declaration = DECLARATIONS[field.name]
            raw = env.get(declaration.variable)
            if raw is not None and raw.strip():
                values[field.name] = raw.strip() if declaration.path else \
                    _convert(declaration.variable, raw.strip(), type(field.default), declaration.valid)
        values.update(overrides)
        return cls(**values)


# Derived from the declarations: each field's, its (variable, valid) pair, the old names and the paths.
DECLARATIONS: dict[str, Declaration] = {f.name: f.metadata["setting"] for f in dataclasses.fields(Settings)}
ENVIRONMENT = {field: (d.variable, d.valid) for field, d in DECLARATIONS.items()}
RENAMED = {d.old_name: d.variable for d in DECLARATIONS.values() if d.old_name}  # old -> new
PATHS = tuple(field for field, d in DECLARATIONS.items() if d.path)
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Settings)}


def _check(declaration: Declaration, value, name: str, kind: type | None = None) -> None:
    """A one-line ConfigError naming ``name`` (the variable, or the keyword as written) unless valid
    (and, with ``kind``, of that type)."""
    try:
        good = (kind is None or _of_type(value, kind)) and declaration.check(value)
    except TypeError:
        good = False
    if not good:
        raise ConfigError(f"{name}={value!r} {declaration.complaint}; valid: {declaration.valid}")


def _of_type(value, kind: type) -> bool:
    """Whether a keyword's value has its field's type (an int will do for a float; a bool is no number)."""
    if kind is bool or isinstance(value, bool):
        return kind is bool and isinstance(value, bool)
    return isinstance(value, (int, float) if kind is float else kind)


def default_text(field: str) -> str:
    """A field's default as the settings table shows it."""
    declaration, default = DECLARATIONS[field], _DEFAULTS[field]
    if declaration.default_text:
        return declaration.default_text
    if isinstance(default, bool):
        return str(int(default))
    if isinstance(default, str):
        return f"`{default}`" if default else "unset"
    return str(default)


def _meaning(declaration: Declaration) -> str:
    if not declaration.old_name:
        return declaration.meaning
    return f"{declaration.meaning}; the old name `{declaration.old_name}` still works, with a warning"


def markdown_table() -> str:
    """The README's settings list: one item per setting, in declaration order, wrapped for reading."""
    items = [f"- `{d.variable}` (default {default_text(field)}; valid: {d.valid}): {_meaning(d)}"
             for field, d in DECLARATIONS.items()]
    return "\n".join(_wrap(item, "  ") for item in items) + "\n"


def readme_region() -> str:
    """What stands between the README's settings-table markers."""
    note = ("`BYTESCHEDULER_PARTITION` is ByteScheduler's partition only; Prophet's queued pieces are "
            "`BYTEPS_PROPHET_PARTITION`'s (0 there uses `BYTESCHEDULER_PARTITION`). No setting changes another.")
    return f"{README_START}\n{markdown_table()}\n{_wrap(note, '')}\n{README_END}"


def _wrap(text: str, indent: str) -> str:
    return textwrap.fill(text, width=MARKDOWN_WIDTH, subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False)


def with_settings_table(readme: str) -> str:
    """``readme`` with the region between its settings-table markers regenerated."""
    start, end = readme.find(README_START), readme.find(README_END)
    if start < 0 or end < start:
        raise ConfigError(f"the README has no {README_START} ... {README_END} region; valid: both markers, "
                          "start before end")
    return readme[:start] + readme_region() + readme[end + len(README_END):]


def settings_help(fields: Iterable[str]) -> str:
    """One sentence for a command's ``--help``: the variables of ``fields`` with their defaults."""
    named = ", ".join(f"{DECLARATIONS[f].variable}={default_text(f).strip('`')}" for f in fields)
    return (f"Scheduler settings come from the environment (defaults: {named}); "
            "`byteps-prophet settings` lists what each means.")


def _convert(name: str, raw: str, kind: type, valid: str):
    if kind is bool:
        return _parse_bool(name, raw)
    if kind is str:
        return raw.lower()
    try:
        return kind(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number; valid: {valid}") from None


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


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean; valid: 0, 1")
