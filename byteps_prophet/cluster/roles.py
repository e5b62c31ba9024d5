"""The environment and command of each role, as a real BytePS / ps-lite cluster has them.

Precedence, lowest first: the caller's environment without any DMLC_*/BYTEPS_*/BYTESCHEDULER_*/
PROPHET_* variables; the compose service's ``environment``; the caller's scheduling knobs
(BYTEPS_SCHEDULER, BYTESCHEDULER_*, PROPHET_*, and the plugin's BYTEPS_PROPHET_* knobs named in
``PASSTHROUGH_NAMES``); the per-run ``env``; and last the topology the cluster decides (role,
addresses, counts, ids), which nothing may override.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Sequence

from byteps_prophet.core.settings import ENVIRONMENT
from byteps_prophet.errors import ConfigError

ENGINES = ("byteps", "mxnet")
# Modules of this room, run in another process or container; strings, because importing them here
# would close a cycle (serve and selftest read the container's description, which imports this module).
SERVE_COMMAND = ("python", "-m", "byteps_prophet.cluster.serve")
SELFTEST_COMMAND = ("python", "-m", "byteps_prophet.cluster.selftest")
DEFAULT_PORT = 9000

# What a role never inherits from the caller unless the compose file or the run asks for it.
_SCRUBBED_PREFIXES = ("DMLC_", "BYTEPS_", "BYTESCHEDULER_", "PROPHET_")
# The caller's Settings pass through to every role (the A/B runner sets these), all but the socket
# directory: the roles share this host's file system, each BytePS worker keeps its own.
PASSTHROUGH_NAMES = tuple(name for name, _ in ENVIRONMENT.values() if name != "BYTEPS_SOCKET_PATH")
PASSTHROUGH_PREFIXES = ("BYTESCHEDULER_", "PROPHET_")
# Set by the cluster; a compose file's values are replaced and a run's env may not set them.
TOPOLOGY_KEYS = (
    "DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_WORKER", "DMLC_NUM_SERVER",
    "DMLC_WORKER_ID", "DMLC_NODE_HOST", "DMLC_INTERFACE", "BYTEPS_LOCAL_RANK", "BYTEPS_LOCAL_SIZE",
    "BYTEPS_PROPHET_CLUSTER", "BYTEPS_PROPHET_HOST",
)
# Link shaping is the entrypoint's job under Docker; locally the cluster shapes from outside.
_DOCKER_ONLY = ("LINK_BANDWIDTH", "LINK_LATENCY", "LINK_DEVICE", "LINK_SHAPING")


@dataclass(frozen=True)
class Topology:
    num_workers: int
    num_servers: int
    root_uri: str
    root_port: int
    interface: str
    cluster_id: str


def is_passthrough(name: str) -> bool:
    return name in PASSTHROUGH_NAMES or name.startswith(PASSTHROUGH_PREFIXES)


def check_engine(engine: str) -> str:
    value = str(engine).strip().lower()
    if value not in ENGINES:
        raise ConfigError(f"engine {engine!r} is not an engine; valid: {', '.join(ENGINES)}")
    return value


def check_run_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """Validate a per-run environment: strings only, and no topology keys."""
    result: dict[str, str] = {}
    for key, value in (env or {}).items():
        if key in TOPOLOGY_KEYS:
            raise ConfigError(f"run env {key} is set by the cluster; remove it (topology keys: "
                              f"{', '.join(TOPOLOGY_KEYS)})")
        if not isinstance(value, str):
            raise ConfigError(f"run env {key}={value!r} must be a string")
        result[str(key)] = value
    return result


def role_environment(*, role: str, index: int, node_host: str, topology: Topology, engine: str,
                     service_env: Mapping[str, str], caller_env: Mapping[str, str],
                     run_env: Mapping[str, str] | None = None,
                     bin_dir: str | None = None) -> dict[str, str]:
    """The full environment of host ``role-index``."""
    env = {k: v for k, v in caller_env.items() if not k.startswith(_SCRUBBED_PREFIXES)}
    env.update({k: v for k, v in service_env.items() if k not in _DOCKER_ONLY})
    env.update({k: v for k, v in caller_env.items() if is_passthrough(k)})
    env.update(check_run_env(run_env))
    env.setdefault("BYTEPS_CPU_ONLY", "1")
    env["ENGINE"] = engine
    env["PYTHONUNBUFFERED"] = "1"
    if bin_dir:
        path = env.get("PATH", os.defpath)
        env["PATH"] = bin_dir + os.pathsep + path if path else bin_dir
    env.update({
        "DMLC_ROLE": role,
        "DMLC_PS_ROOT_URI": topology.root_uri,
        "DMLC_PS_ROOT_PORT": str(topology.root_port),
        "DMLC_NUM_WORKER": str(topology.num_workers),
        "DMLC_NUM_SERVER": str(topology.num_servers),
        "DMLC_NODE_HOST": node_host,
        "DMLC_INTERFACE": topology.interface,
        "BYTEPS_LOCAL_RANK": "0",
        "BYTEPS_LOCAL_SIZE": "1",
        "BYTEPS_PROPHET_CLUSTER": topology.cluster_id,
        "BYTEPS_PROPHET_HOST": host_name(role, index),
    })
    if role == "worker":
        env["DMLC_WORKER_ID"] = str(index)
    else:
        env.pop("DMLC_WORKER_ID", None)
    return env


def host_name(role: str, index: int) -> str:
    return "scheduler" if role == "scheduler" else f"{role}-{index}"


def role_command(role: str, service_command: Sequence[str] | None,
                 worker_command: Sequence[str] | None) -> tuple[str, ...]:
    """Workers run the given COMMAND (or the compose command); scheduler and servers the compose command."""
    if role == "worker" and worker_command:
        return tuple(worker_command)
    if service_command:
        return tuple(service_command)
    return SERVE_COMMAND if role != "worker" else SELFTEST_COMMAND
