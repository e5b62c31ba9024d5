"""The cluster description: one YAML file that says what runs where (docs/DEPLOY.md).

    name: bpp                        # prefix of every rendered object (a DNS label)
    image: byteps-prophet:cpu        # the image every role runs (compose, Kubernetes, Pods)
    engine: byteps                   # byteps or mxnet: the parameter server
    port: 9000                       # the scheduler's ps-lite port (DMLC_PS_ROOT_PORT)
    control_port: 9001               # the launchers' supervision port on the scheduler host (port + 1)
    schedule: prophet                # BYTEPS_SCHEDULER: fifo, bytescheduler or prophet
    command: python train.py         # what each worker runs (string or list)
    python: python                   # the interpreter in the image that runs the launcher
    env: {TRAIN_MODEL: mlp}          # extra environment for every role
    volumes: [{host: /data, path: /data, read_only: true}]
    scheduler: {host: 10.0.0.1, cpu: "1", memory: 1Gi}
    servers: {hosts: [10.0.0.1], cpu: "2", memory: 4Gi}          # or count: N
    workers: {hosts: [10.0.0.2, 10.0.0.3], cpu: "4", memory: 8Gi, gpus: 1}

Host addresses are needed where the roles run on machines a user names (per-host compose files,
``launch --cluster``); Kubernetes and Pods need only the counts. :func:`load_description` checks the
whole file at once; every error is one line naming the key and what is valid.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from byteps_prophet.ab.workloads import train_entrypoint
from byteps_prophet.cluster.compose import read_yaml
from byteps_prophet.cluster.roles import DEFAULT_PORT, ENGINES, TOPOLOGY_KEYS
from byteps_prophet.core.settings import SCHEDULERS
from byteps_prophet.errors import ConfigError

TOP_KEYS = ("name", "image", "engine", "port", "control_port", "schedule", "command", "python", "env",
            "volumes", "scheduler", "servers", "workers")
ROLE_KEYS = {"scheduler": ("host", "cpu", "memory"),
             "servers": ("hosts", "count", "cpu", "memory"),
             "workers": ("hosts", "count", "cpu", "memory", "gpus")}
VOLUME_KEYS = ("host", "path", "read_only")
DEFAULT_IMAGE = "byteps-prophet:cpu"
DEFAULT_COMMAND = ("python", "-m", train_entrypoint.__name__)
# A DNS label short enough that "<name>-scheduler" and "<name>-worker-<i>" stay labels too (63).
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")
# Kubernetes quantities: a decimal number with an optional SI or binary suffix (500m, 2, 1.5, 4Gi).
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Role:
    """One role's part of the description: how many hosts, where, and what each may use."""

    count: int
    hosts: tuple[str, ...] = ()   # addresses, one per host; empty when only the count was given
    cpu: str | None = None         # Kubernetes quantities (requests; memory is also the limit)
    memory: str | None = None
    gpus: int = 0                  # workers only: nvidia.com/gpu per worker (0 or 1)


@dataclass(frozen=True)
class Volume:
    host: str        # a directory on the host (hostPath, a compose bind mount)
    path: str        # where the roles see it
    read_only: bool = False


@dataclass(frozen=True)
class Description:
    name: str = "bpp"
    image: str = DEFAULT_IMAGE
    engine: str = "byteps"
    port: int = DEFAULT_PORT
    control_port: int = DEFAULT_PORT + 1
    schedule: str = "prophet"
    command: tuple[str, ...] = DEFAULT_COMMAND
    python: str = "python"
    env: Mapping[str, str] = field(default_factory=dict)
    volumes: tuple[Volume, ...] = ()
    scheduler: Role = Role(1)
    servers: Role = Role(1)
    workers: Role = Role(1)
    source: str = "<description>"

    @property
    def scheduler_host(self) -> str | None:
        return self.scheduler.hosts[0] if self.scheduler.hosts else None

    def object_name(self, role: str, index: int | None = None) -> str:
        """``<name>-scheduler``, ``<name>-server``, ``<name>-worker-1``: Kubernetes and Pod names."""
        base = f"{self.name}-{role}"
        return base if index is None else f"{base}-{index}"

    def placements(self) -> list[tuple[str, int, str | None]]:
        """Every host of the job as (role, index, address): the scheduler, the servers, the workers."""
        out: list[tuple[str, int, str | None]] = [("scheduler", 0, self.scheduler_host)]
        for role, part in (("server", self.servers), ("worker", self.workers)):
            out += [(role, i, part.hosts[i] if part.hosts else None) for i in range(part.count)]
        return out


def _fail(where: str, message: str) -> ConfigError:
    return ConfigError(f"{where}: {message}")


def _check_keys(where: str, data: Any, valid: tuple[str, ...]) -> dict:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise _fail(where, f"must be a mapping with keys {', '.join(valid)}")
    for key in data:
        if key not in valid:
            raise _fail(where, f"unknown key {key!r}; valid: {', '.join(valid)}")
    return data


def _port(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise _fail(where, f"{value!r} is not a TCP port; valid: an integer 1-65535")
    return value


def _quantity(where: str, value: Any) -> str | None:
    if value is None:
        return None
    text = str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    if not isinstance(text, str) or not _QUANTITY.match(text):
        raise _fail(where, f"{value!r} is not a quantity; valid: e.g. 500m, 2, 1.5 (cpu), 512Mi, 4Gi (memory)")
    return text


def _address(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value.strip()):
        raise _fail(where, f"{value!r} is not a host address; valid: an IP address or a host name")
    return value.strip()


def parse_command(where: str, value: Any) -> tuple[str, ...]:
    """A command as a list of words, or a string split like a shell would."""
    if isinstance(value, str):
        try:
            words = shlex.split(value)
        except ValueError as err:
            raise _fail(where, f"{value!r} does not split into words ({err})") from None
    elif isinstance(value, list) and all(isinstance(w, (str, int, float)) for w in value):
        words = [str(w) for w in value]
    else:
        raise _fail(where, f"{value!r} is not a command; valid: a string or a list of words")
    if not words:
        raise _fail(where, "is empty; valid: a string or a list of words")
    return tuple(words)


def _role(where: str, data: Any, role: str) -> Role:
    data = _check_keys(where, data, ROLE_KEYS[role])
    if role == "scheduler":
        hosts = (_address(f"{where}.host", data["host"]),) if data.get("host") is not None else ()
        count = 1
    else:
        raw_hosts = data.get("hosts")
        if raw_hosts is None:
            hosts = ()
        elif isinstance(raw_hosts, list) and raw_hosts:
            hosts = tuple(_address(f"{where}.hosts[{i}]", h) for i, h in enumerate(raw_hosts))
        else:
            raise _fail(f"{where}.hosts", f"{raw_hosts!r} is not a list of addresses; valid: e.g. [10.0.0.2, 10.0.0.3]")
        raw_count = data.get("count", len(hosts) or 1)
        if isinstance(raw_count, bool) or not isinstance(raw_count, int) or raw_count < 1:
            raise _fail(f"{where}.count", f"{raw_count!r} is invalid; valid: an integer >= 1")
        if hosts and raw_count != len(hosts):
            raise _fail(where, f"count {raw_count} but {len(hosts)} hosts; valid: one address per {role[:-1]}, "
                               f"or count alone")
        count = raw_count
    gpus = data.get("gpus", 0)
    if role == "workers" and (isinstance(gpus, bool) or gpus not in (0, 1)):
        raise _fail(f"{where}.gpus", f"{gpus!r} is invalid; valid: 0 (CPU-only) or 1 (one GPU per worker "
                                     f"process: run one worker per GPU)")
    return Role(count=count, hosts=hosts, cpu=_quantity(f"{where}.cpu", data.get("cpu")),
                memory=_quantity(f"{where}.memory", data.get("memory")), gpus=gpus)


def _env(where: str, data: Any) -> dict[str, str]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise _fail(where, "must be a mapping of NAME: value")
    env = {}
    for key, value in data.items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise _fail(where, f"{key!r} is not a variable name; valid: letters, digits and _")
        if key in TOPOLOGY_KEYS or key == "BYTEPS_SCHEDULER":
            what = "schedule" if key == "BYTEPS_SCHEDULER" else "the roles and hosts"
            raise _fail(f"{where}.{key}", f"is set from {what} of the description; remove it")
        if isinstance(value, (dict, list)) or value is None:
            raise _fail(f"{where}.{key}", f"{value!r} is not a value; valid: a string or a number")
        env[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


def _volumes(where: str, data: Any) -> tuple[Volume, ...]:
    if data is None:
        return ()
    if not isinstance(data, list):
        raise _fail(where, "must be a list of {host, path, read_only}")
    out = []
    for i, item in enumerate(data):
        item = _check_keys(f"{where}[{i}]", item, VOLUME_KEYS)
        paths = []
        for key in ("host", "path"):
            value = item.get(key)
            if not isinstance(value, str) or not value.startswith("/"):
                raise _fail(f"{where}[{i}].{key}", f"{value!r} is invalid; valid: an absolute path")
            paths.append(value.rstrip("/") or "/")
        read_only = item.get("read_only", False)
        if not isinstance(read_only, bool):
            raise _fail(f"{where}[{i}].read_only", f"{read_only!r} is invalid; valid: true, false")
        out.append(Volume(paths[0], paths[1], read_only))
    return tuple(out)


def parse_description(data: Any, source: str = "<description>") -> Description:
    """A :class:`Description` from the parsed YAML ``data``; ``source`` names it in errors."""
    data = _check_keys(source, data, TOP_KEYS)
    name = data.get("name", "bpp")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _fail(f"{source}: name", f"{name!r} is invalid; valid: lowercase letters, digits and '-', "
                                       f"starting with a letter, at most 40 characters")
    image = data.get("image", DEFAULT_IMAGE)
    if not isinstance(image, str) or not image.strip() or any(c.isspace() for c in image):
        raise _fail(f"{source}: image", f"{image!r} is not an image name")
    engine = str(data.get("engine", "byteps"))
    if engine not in ENGINES:
        raise _fail(f"{source}: engine", f"{engine!r} is not an engine; valid: {', '.join(ENGINES)}")
    port = _port(f"{source}: port", data.get("port", DEFAULT_PORT))
    control_port = _port(f"{source}: control_port", data.get("control_port", port + 1 if port < 65535 else 0))
    if control_port == port:
        raise _fail(f"{source}: control_port", f"{control_port} is the scheduler's port too; valid: another port")
    schedule = str(data.get("schedule", "prophet"))
    if schedule not in SCHEDULERS:
        raise _fail(f"{source}: schedule", f"{schedule!r} is not a scheduler; valid: {', '.join(SCHEDULERS)}")
    command = parse_command(f"{source}: command", data.get("command", list(DEFAULT_COMMAND)))
    python = data.get("python", "python")
    if not isinstance(python, str) or not python.strip():
        raise _fail(f"{source}: python", f"{python!r} is not an interpreter; valid: e.g. python, /opt/venv/bin/python")
    description = Description(
        name=name, image=image, engine=engine, port=port, control_port=control_port, schedule=schedule,
        command=command, python=python, env=_env(f"{source}: env", data.get("env")),
        volumes=_volumes(f"{source}: volumes", data.get("volumes")),
        scheduler=_role(f"{source}: scheduler", data.get("scheduler"), "scheduler"),
        servers=_role(f"{source}: servers", data.get("servers"), "servers"),
        workers=_role(f"{source}: workers", data.get("workers"), "workers"),
        source=source,
    )
    return description


def load_description(path: str | Path) -> Description:
    """Read and check the description at ``path`` (one-line ``ConfigError`` on any problem)."""
    return parse_description(read_yaml(Path(path), f"--cluster {path}"), str(path))


def require_hosts(description: Description, what: str) -> None:
    """``what`` (a target or ``launch --cluster``) needs every host's address: say which is missing."""
    missing = []
    if not description.scheduler.hosts:
        missing.append("scheduler.host")
    for key, part in (("servers", description.servers), ("workers", description.workers)):
        if not part.hosts:
            missing.append(f"{key}.hosts")
    if missing:
        raise ConfigError(f"{description.source}: {what} needs every host's address; missing: "
                          f"{', '.join(missing)}")
