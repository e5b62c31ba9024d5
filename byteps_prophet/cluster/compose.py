"""Read the cluster definition from a docker-compose file, so the local cluster runs what Docker runs.

The contract (docs/CLUSTER.md has it in full):

* every service with ``DMLC_ROLE`` in its ``environment`` is a cluster host; its role is that value
  (``scheduler``, ``server`` or ``worker``); other services are ignored;
* exactly one scheduler, at least one server and one worker;
* servers and workers are taken in file order: host ``worker-i`` uses the i-th worker service, and the
  last one serves as the template when more are asked for than the file has;
* ``environment`` (mapping or ``KEY=VALUE`` list) and ``command`` (list or string) are used as written,
  after compose's ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?message}`` and ``$$``
  interpolation against the caller's environment. A key without a value passes the caller's value
  through (and is left out when the caller has none), as in compose.
"""
from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from byteps_prophet.errors import ConfigError

ROLES = ("scheduler", "server", "worker")

_VAR = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    r"|(?P<named>[A-Za-z_][A-Za-z0-9_]*)|(?P<invalid>))"
)


# The all-reduce cluster (workers only, no parameter server) that gloo and NCCL runs use.
GLOO_COMPOSE = Path(__file__).with_name("gloo-compose.yml")


COMPOSE_FILE = Path("docker") / "docker-compose.yml"


def default_compose_path(source_root: Path | None = None, cwd: Path | None = None) -> Path:
    """The repository's docker/docker-compose.yml (the one cluster definition): beside the package in
    a source checkout, else under the current directory (an installed package: the repository root,
    or the Docker image's workdir). Neither: a one-line error saying where it must be."""
    source_root = Path(__file__).resolve().parents[2] if source_root is None else source_root
    cwd = Path.cwd() if cwd is None else cwd
    for root in (source_root, cwd):
        if (root / COMPOSE_FILE).is_file():
            return root / COMPOSE_FILE
    raise ConfigError(f"no cluster definition: {COMPOSE_FILE} is not under the current directory ({cwd}) nor "
                      f"beside the package; run from the repository root (or the image's workdir), or pass "
                      f"`cluster run --compose FILE`")


def interpolate(text: str, environ: Mapping[str, str], where: str = "compose file") -> str:
    """Compose-style variable substitution of one string."""

    def substitute(match: re.Match) -> str:
        if match.group("escaped") is not None:
            return "$"
        name = match.group("braced") or match.group("named")
        if name is None:
            raise ConfigError(f"{where}: invalid interpolation in {text!r}; use $VAR, ${{VAR}}, "
                              f"${{VAR:-default}} or $$ for a literal $")
        op, arg = match.group("op"), match.group("arg")
        value = environ.get(name)
        if op is None:
            return value if value is not None else ""
        unset = value is None or (op.startswith(":") and value == "")
        if op.endswith("-"):
            return interpolate(arg, environ, where) if unset else value
        if unset:  # '?' / ':?'
            raise ConfigError(f"{where}: required variable {name} is not set: {arg or 'no message'}")
        return value

    return _VAR.sub(substitute, text)


@dataclass(frozen=True)
class ServiceDef:
    """One compose service that is a cluster host."""

    name: str
    role: str
    environment: dict[str, str] = field(default_factory=dict)
    command: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ComposeDefinition:
    path: Path | None
    scheduler: ServiceDef
    servers: tuple[ServiceDef, ...]
    workers: tuple[ServiceDef, ...]

    def template(self, role: str, index: int) -> ServiceDef:
        """The service host ``role-index`` is built from (the last one of its role repeats)."""
        if role == "scheduler":
            return self.scheduler
        pool = self.servers if role == "server" else self.workers
        return pool[min(index, len(pool) - 1)]


def _scalar(value, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise ConfigError(f"{where}: value {value!r} must be a string, number or boolean")


def _environment(raw, environ: Mapping[str, str], where: str) -> dict[str, str]:
    pairs: list[tuple[str, object]] = []
    if raw is None:
        return {}
    if isinstance(raw, Mapping):
        pairs = [(str(k), v) for k, v in raw.items()]
    elif isinstance(raw, list):
        for item in raw:
            if not isinstance(item, str):
                raise ConfigError(f"{where}: environment entry {item!r} must be KEY=VALUE or KEY")
            key, sep, value = item.partition("=")
            pairs.append((key, value if sep else None))
    else:
        raise ConfigError(f"{where}: environment must be a mapping or a list of KEY=VALUE")
    env: dict[str, str] = {}
    for key, value in pairs:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ConfigError(f"{where}: environment key {key!r} is not a valid variable name")
        if value is None:  # pass the caller's value through, as compose does
            if key in environ:
                env[key] = environ[key]
            continue
        env[key] = interpolate(_scalar(value, f"{where} {key}"), environ, f"{where} {key}")
    return env


def _command(raw, environ: Mapping[str, str], where: str) -> tuple[str, ...] | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        return tuple(shlex.split(interpolate(raw, environ, where)))
    if isinstance(raw, list):
        return tuple(interpolate(_scalar(part, where), environ, where) for part in raw)
    raise ConfigError(f"{where}: command must be a list or a string")


def parse_compose(document, environ: Mapping[str, str] | None = None,
                  path: Path | None = None) -> ComposeDefinition:
    """Build the definition from an already-loaded YAML document."""
    environ = os.environ if environ is None else environ
    label = str(path) if path else "compose file"
    if not isinstance(document, Mapping) or not isinstance(document.get("services"), Mapping):
        raise ConfigError(f"{label}: no 'services' mapping; expected a docker-compose file")
    by_role: dict[str, list[ServiceDef]] = {role: [] for role in ROLES}
    for name, body in document["services"].items():
        where = f"{label}: service {name}"
        if body is None:
            body = {}
        if not isinstance(body, Mapping):
            raise ConfigError(f"{where}: must be a mapping")
        env = _environment(body.get("environment"), environ, where)
        role = env.get("DMLC_ROLE")
        if role is None:
            continue
        if role not in ROLES:
            raise ConfigError(f"{where}: DMLC_ROLE={role!r} is not a role; valid: {', '.join(ROLES)}")
        by_role[role].append(ServiceDef(str(name), role, env, _command(body.get("command"), environ, where)))
    if len(by_role["scheduler"]) != 1:
        found = ", ".join(s.name for s in by_role["scheduler"]) or "none"
        raise ConfigError(f"{label}: needs exactly one service with DMLC_ROLE=scheduler (found: {found})")
    for role in ("server", "worker"):
        if not by_role[role]:
            raise ConfigError(f"{label}: needs at least one service with DMLC_ROLE={role}")
    return ComposeDefinition(path, by_role["scheduler"][0], tuple(by_role["server"]), tuple(by_role["worker"]))


def load_compose(path: str | os.PathLike | None = None,
                 environ: Mapping[str, str] | None = None) -> ComposeDefinition:
    """Read and validate a compose file (default: the repository's docker/docker-compose.yml)."""
    file = Path(path) if path is not None else default_compose_path()
    document = read_yaml(file, f"compose file {file}", unreadable_hint="; pass an existing file with --compose")
    return parse_compose(document, environ, file)


def read_yaml(file: Path, label: str, unreadable_hint: str = ""):
    """The YAML document in ``file``, or a one-line ConfigError starting with ``label`` (a file that
    cannot be read, or is not YAML, with the line where parsing failed)."""
    import yaml

    try:
        text = file.read_text()
    except OSError as err:
        raise ConfigError(f"{label}: cannot read it ({err.strerror or err}){unreadable_hint}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{label}: not valid YAML{at}") from None
