"""What a cluster container is asked to do, read from its environment (the compose file's) in one place.

The containers' entrypoints (serve, selftest, linkshape, train and the agent) take their job from the
variables below. They are not ``Settings``: they say which engine a container starts, how it shapes
its own link and which self-test or training job it runs, not how the plugins schedule; a user's
training script never reads them, and the core stays free of the cluster. Where the process sits in
the job (``DMLC_*``, ``RANK``) comes from ``backends/rendezvous.py``, as everywhere else.

:func:`container` reads and checks every variable at once: an invalid one ends the entrypoint with a
one-line ``ConfigError`` naming it and what is valid (the README's "Cluster containers" table lists
them all; tests/test_settings.py checks it against ``VARIABLES``).
"""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import Callable, Mapping

from byteps_prophet.cluster.roles import ENGINES
from byteps_prophet.errors import ConfigError
from byteps_prophet.units import parse_bandwidth, parse_latency

FRAMEWORKS = ("torch", "mxnet")  # the BytePS plugin the self-test pushes through
OFF = ("0", "false", "no", "off")
ON = ("1", "true", "yes", "on")


def _choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw.lower() not in choices:
            raise ValueError
        return raw.lower()
    return parse


def _integer(least: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        value = int(raw)
        if value < least:
            raise ValueError
        return value
    return parse


def _seconds(raw: str) -> float:
    value = float(raw)
    if value <= 0:
        raise ValueError
    return value


def _switch(raw: str) -> bool:
    if raw.lower() not in OFF + ON:
        raise ValueError
    return raw.lower() in ON


def parse_sizes(raw: str) -> tuple[int, ...]:
    sizes = tuple(int(part) for part in raw.split(","))
    if min(sizes) < 1:
        raise ValueError
    return sizes


def _rate(raw: str) -> str:
    parse_bandwidth(raw)  # its own ConfigError says the units; re-raised below naming the variable
    return raw


def _delay(raw: str) -> str:
    parse_latency(raw)
    return raw


# field: (variable, default, parser, what is valid); "" as default: unset means None.
VARIABLES = {
    "engine": ("ENGINE", "byteps", _choice(ENGINES), ", ".join(ENGINES)),
    "link_bandwidth": ("LINK_BANDWIDTH", "none", _rate, "a rate such as 1gbit or 200mbit, or none"),
    "link_latency": ("LINK_LATENCY", "0ms", _delay, "a one-way delay such as 0ms or 1ms"),
    "link_device": ("LINK_DEVICE", "eth0", str, "a network device"),
    "link_shaping": ("LINK_SHAPING", "1", _switch, "0, 1"),
    "selftest_sizes": ("SELFTEST_SIZES", "7,262144", parse_sizes, "comma-separated positive integers (float32 elements)"),
    "selftest_rounds": ("SELFTEST_ROUNDS", "3", _integer(1), "an integer >= 1"),
    "selftest_framework": ("SELFTEST_FRAMEWORK", "torch", _choice(FRAMEWORKS), ", ".join(FRAMEWORKS)),
    "train_model": ("TRAIN_MODEL", "resnet", str, "a model of the engine's bench (its --help)"),
    "train_steps": ("TRAIN_STEPS", "10", _integer(1), "an integer >= 1"),
    "train_warmup": ("TRAIN_WARMUP", "3", _integer(0), "an integer >= 0"),
    "train_batch": ("TRAIN_BATCH", "", _integer(1), "an integer >= 1 (unset: the bench's default)"),
    "train_command": ("TRAIN_COMMAND", "", shlex.split, "a shell-style command (workers' second job)"),
    "host": ("CLUSTER_HOST", "", str, "this container's name (unset: the hostname)"),
    "coordinator": ("CLUSTER_COORDINATOR", "worker-0", str, "the coordinating agent's container"),
    "coordinator_address": ("CLUSTER_COORDINATOR_ADDRESS", "", str, "its address (unset: its name)"),
    "agent_port": ("CLUSTER_AGENT_PORT", "9999", _integer(0), "an integer >= 0 (TCP port)"),
    "connect_timeout": ("CLUSTER_CONNECT_TIMEOUT", "300", _seconds, "a positive number of seconds"),
    "grace": ("CLUSTER_GRACE", "10", _seconds, "a positive number of seconds"),
    "timeout": ("CLUSTER_TIMEOUT", "", _seconds, "a positive number of seconds (unset: no limit)"),
}


@dataclass(frozen=True)
class Container:
    engine: str
    link_bandwidth: str
    link_latency: str
    link_device: str
    link_shaping: bool
    selftest_sizes: tuple[int, ...]
    selftest_rounds: int
    selftest_framework: str
    train_model: str
    train_steps: int
    train_warmup: int
    train_batch: int | None
    train_command: list[str] | None
    host: str | None
    coordinator: str
    coordinator_address: str | None
    agent_port: int
    connect_timeout: float
    grace: float
    timeout: float | None


def container(environ: Mapping[str, str] | None = None) -> Container:
    """Every variable of ``VARIABLES`` from ``environ`` (default: the process environment), checked."""
    env = os.environ if environ is None else environ
    values = {}
    for field, (name, default, parse, valid) in VARIABLES.items():
        raw = (env.get(name) or "").strip() or default
        try:
            values[field] = parse(raw) if raw else None
        except (ValueError, ConfigError):
            raise ConfigError(f"{name}={raw!r} is invalid; valid: {valid}") from None
    return Container(**values)
