"""``byteps-prophet launch``: one host's part of a BytePS job that spans several machines.

Run it on every host of the cluster with that host's role, as BytePS's own launcher is run::

    byteps-prophet launch --role scheduler --scheduler-addr 10.0.0.1 --workers 2 --servers 1
    byteps-prophet launch --role server    --scheduler-addr 10.0.0.1 --workers 2 --servers 1
    byteps-prophet launch --role worker    --scheduler-addr 10.0.0.1 --workers 2 --servers 1 --worker-id 0 -- python train.py

Every option falls back on the variable BytePS documents (``DMLC_ROLE``, ``DMLC_PS_ROOT_URI``,
``DMLC_PS_ROOT_PORT``, ``DMLC_NUM_WORKER``, ``DMLC_NUM_SERVER``, ``DMLC_WORKER_ID``,
``DMLC_NODE_HOST``, ``DMLC_INTERFACE``; ``BYTEPS_SCHEDULER``, ``ENGINE``), so a manifest can set
those and run ``launch -- COMMAND``; ``--cluster FILE --host NAME`` takes them from a description.

Plain BytePS has no notion of the job: when a host dies, the others wait on it for ever. Here the
launcher on the scheduler host is the job's coordinator; the others connect to it on the control
port (``DMLC_PS_ROOT_PORT`` + 1) and report. The coordinator

* waits until every server and worker has connected, checks that they agree on the topology (counts,
  engine, no worker id twice), then tells them all to start their role, with worker 0's address for
  the order channel of Prophet and ByteScheduler (``MASTER_ADDR``/``MASTER_PORT``);
* ends the job when every worker succeeded (scheduler and servers then exit on their own, or are
  stopped after ``--grace``), or at once when a role exits non-zero, when a host's launcher goes
  (its connection closes: killed) or falls silent for ``--heartbeat-timeout`` seconds (host down,
  link cut), naming that host; ``--timeout`` bounds the whole job.

Every launcher prints the verdict on one line naming the role (``launch: worker-1 failed: ...``) and
exits with the job's status: 0, the failed role's (128+N when killed by signal N), 1 for a lost
host, 124 on timeout. A launcher that loses the coordinator stops its role and names the scheduler.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from byteps_prophet.cluster.roles import DEFAULT_PORT, ENGINES, TOPOLOGY_KEYS, host_name
from byteps_prophet.core.settings import SCHEDULERS
from byteps_prophet.deploy.coordinator import Coordinator
from byteps_prophet.deploy.follower import Follower
from byteps_prophet.deploy.role import ROLE_PREFIXES, Role, source_address
from byteps_prophet.errors import ConfigError

ROLES = ("scheduler", "server", "worker")


# --------------------------------------------------------------------------------------------- spec
@dataclass(frozen=True)
class LaunchSpec:
    role: str
    scheduler_addr: str
    port: int
    control_port: int
    workers: int
    servers: int
    worker_id: int | None = None
    server_id: int | None = None
    node_host: str | None = None          # None: the address this host reaches the scheduler from
    interface: str | None = None          # None: the interface holding node_host
    engine: str = "byteps"
    schedule: str | None = None           # BYTEPS_SCHEDULER; None leaves it to the environment
    command: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    connect_timeout: float = 300.0
    heartbeat_timeout: float = 10.0
    grace: float = 10.0
    timeout: float | None = None

    @property
    def name(self) -> str:
        """This host's name in messages: scheduler, server-<id> (server until the scheduler host numbers
        it), worker-<id>."""
        if self.role == "server" and self.server_id is None:
            return "server"
        index = self.worker_id if self.role == "worker" else self.server_id
        return host_name(self.role, index or 0)


def _integer(raw, what: str, least: int, most: int | None = None) -> int:
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = None
    if value is None or value < least or (most is not None and value > most):
        span = f"{least}-{most}" if most is not None else f">= {least}"
        raise ConfigError(f"{what} {raw!r} is invalid; valid: an integer {span}")
    return value


def _seconds(raw, what: str) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    if not value > 0:
        raise ConfigError(f"{what} {raw!r} is invalid; valid: a positive number of seconds")
    return value


def build_spec(*, role=None, scheduler_addr=None, scheduler_port=None, control_port=None, workers=None,
               servers=None, worker_id=None, server_id=None, node_host=None, interface=None, engine=None,
               schedule=None, command: Sequence[str] = (), env: Mapping[str, str] | None = None,
               connect_timeout=300.0, heartbeat_timeout=10.0, grace=10.0, timeout=None,
               environ: Mapping[str, str] | None = None) -> LaunchSpec:
    """Options first, then the variables BytePS documents; every problem is one line naming the option
    and its variable, and what is valid."""
    environ = os.environ if environ is None else environ

    def pick(value, variable: str):
        if value is not None and value != "":
            return value
        raw = (environ.get(variable) or "").strip()
        return raw or None

    role = pick(role, "DMLC_ROLE")
    if role is None:
        raise ConfigError(f"no role: pass --role or set DMLC_ROLE; valid: {', '.join(ROLES)}")
    if role not in ROLES:
        raise ConfigError(f"--role/DMLC_ROLE {role!r} is not a role; valid: {', '.join(ROLES)}")
    addr = pick(scheduler_addr, "DMLC_PS_ROOT_URI")
    if addr is None:
        raise ConfigError("no scheduler address: pass --scheduler-addr or set DMLC_PS_ROOT_URI; valid: "
                          "the scheduler host's IP address or name")
    if any(c.isspace() for c in addr) or "/" in addr:
        raise ConfigError(f"--scheduler-addr/DMLC_PS_ROOT_URI {addr!r} is not an address; valid: an IP "
                          f"address or a host name")
    port = _integer(pick(scheduler_port, "DMLC_PS_ROOT_PORT") or DEFAULT_PORT,
                    "--scheduler-port/DMLC_PS_ROOT_PORT", 1, 65535)
    control = _integer(control_port if control_port is not None else port + 1, "--control-port", 1, 65535)
    if control == port:
        raise ConfigError(f"--control-port {control} is the scheduler's port too; valid: another port")
    counts = {}
    for key, value, variable in (("workers", workers, "DMLC_NUM_WORKER"), ("servers", servers, "DMLC_NUM_SERVER")):
        raw = pick(value, variable)
        if raw is None:
            raise ConfigError(f"no number of {key}: pass --{key} or set {variable}; valid: an integer >= 1")
        counts[key] = _integer(raw, f"--{key}/{variable}", 1)
    wid = None
    if role == "worker":
        raw = pick(worker_id, "DMLC_WORKER_ID")
        if raw is None:
            if counts["workers"] > 1:
                raise ConfigError(f"no worker id: pass --worker-id or set DMLC_WORKER_ID; valid: 0-"
                                  f"{counts['workers'] - 1}")
            raw = 0
        wid = _integer(raw, "--worker-id/DMLC_WORKER_ID", 0, counts["workers"] - 1)
    sid = None
    if role == "server" and server_id is not None:
        sid = _integer(server_id, "--server-id", 0, counts["servers"] - 1)
    engine = pick(engine, "ENGINE") or "byteps"
    if engine not in ENGINES:
        raise ConfigError(f"--engine/ENGINE {engine!r} is not an engine; valid: {', '.join(ENGINES)}")
    schedule = pick(schedule, "BYTEPS_SCHEDULER")
    if schedule is not None and schedule not in SCHEDULERS:
        raise ConfigError(f"--byteps-scheduler/BYTEPS_SCHEDULER {schedule!r} is not a scheduler; valid: "
                          f"{', '.join(SCHEDULERS)}")
    command = tuple(command)
    if role == "worker" and not command:
        raise ConfigError("a worker needs its COMMAND after --, e.g. -- python train.py")
    extra = dict(env or {})
    for key in extra:
        if key in TOPOLOGY_KEYS:
            raise ConfigError(f"-e {key} is set by the launcher; remove it (set by it: {', '.join(TOPOLOGY_KEYS)})")
    return LaunchSpec(
        role=role, scheduler_addr=addr, port=port, control_port=control, workers=counts["workers"],
        servers=counts["servers"], worker_id=wid, server_id=sid, node_host=pick(node_host, "DMLC_NODE_HOST"),
        interface=pick(interface, "DMLC_INTERFACE"), engine=engine, schedule=schedule, command=command,
        env=extra, connect_timeout=_seconds(connect_timeout, "--connect-timeout"),
        heartbeat_timeout=_seconds(heartbeat_timeout, "--heartbeat-timeout"), grace=_seconds(grace, "--grace"),
        timeout=None if timeout is None else _seconds(timeout, "--timeout"),
    )


def spec_from_description(description, host: str, command: Sequence[str] = (), **options) -> LaunchSpec:
    """The spec of host ``host`` (scheduler, server-I, worker-I) of a cluster description."""
    from byteps_prophet.deploy.description import require_hosts

    require_hosts(description, "launch --cluster")
    places = {host_name(role, index): (role, index, address) for role, index, address in description.placements()}
    if host not in places:
        raise ConfigError(f"--host {host!r} is not a host of {description.source}; valid: {', '.join(places)}")
    role, index, address = places[host]
    env = dict(description.env)
    env.update(options.pop("env", None) or {})
    if role == "worker":
        env.setdefault("BYTEPS_CPU_ONLY", "0" if description.workers.gpus else "1")
    return build_spec(
        role=role, scheduler_addr=description.scheduler_host, scheduler_port=description.port,
        control_port=description.control_port, workers=description.workers.count,
        servers=description.servers.count, worker_id=index if role == "worker" else None,
        server_id=index if role == "server" else None, node_host=address, engine=description.engine,
        schedule=description.schedule, command=tuple(command) or (description.command if role == "worker" else ()),
        env=env, environ={}, **options)


def run(spec: LaunchSpec, environ: Mapping[str, str] | None = None) -> int:
    """This host's part of the job: the coordinator on the scheduler host, a follower elsewhere."""
    launcher = Coordinator if spec.role == "scheduler" else Follower
    return launcher(spec, environ).run()


def dry_run(spec: LaunchSpec, environ: Mapping[str, str] | None = None) -> str:
    """What this host would run, with the role's DMLC_*/BYTEPS_* environment (node address as given, or
    the one this host reaches the scheduler from)."""
    try:
        node_host = spec.node_host or source_address(spec.scheduler_addr, spec.port)
    except OSError:
        node_host = "<the address this host reaches the scheduler from>"
    role = Role(spec, dict(os.environ if environ is None else environ))
    env = role.environment(node_host)
    lines = [f"{spec.name}: {' '.join(role.command())}",
             f"    control: {'listens on' if spec.role == 'scheduler' else 'connects to'} "
             f"{spec.scheduler_addr}:{spec.control_port}"]
    for key in sorted(env):
        if key.startswith(ROLE_PREFIXES + ("ENGINE",)):
            lines.append(f"    {key}={env[key]}")
    return "\n".join(lines)
