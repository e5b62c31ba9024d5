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

import fcntl
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from byteps_prophet.backends.rendezvous import ORDER_CHANNEL_PORT
from byteps_prophet.cluster.agent import Channel
from byteps_prophet.cluster.netns import process_alive
from byteps_prophet.cluster.roles import (
    DEFAULT_PORT, ENGINES, SERVE_COMMAND, TOPOLOGY_KEYS, Topology, host_name, is_passthrough, role_environment,
)
from byteps_prophet.core.settings import SCHEDULERS
from byteps_prophet.errors import ConfigError

ROLES = ("scheduler", "server", "worker")
HEARTBEAT_S = 1.0          # how often each side says it is alive
STOP_GRACE = 3.0           # SIGTERM -> SIGKILL for a role
# How long workers may still run after the scheduler or a server ended cleanly: a normal BytePS
# shutdown once every worker called shutdown(), and a worker's own exit can take seconds after it.
EXIT_GRACE = 20.0
SOCKET_DIR_PREFIX = "bpp-launch-"
# Variables a host's environment passes to its role as they are (BytePS's, ps-lite's, the knobs).
_ROLE_PREFIXES = ("DMLC_", "BYTEPS_", "BYTESCHEDULER_", "PROPHET_")


def say(text: str) -> None:
    print(f"launch: {text}", file=sys.stderr, flush=True)


def describe_status(code: int) -> str:
    """``-9`` (Popen) -> 'killed by SIGKILL'; ``3`` -> 'exit status 3'."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def exit_code(code: int) -> int:
    return 128 - code if code < 0 else code


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


# ------------------------------------------------------------------------------------ addresses
def interface_of(address: str) -> str | None:
    """The network interface whose (primary IPv4) address is ``address``, or None."""
    for _index, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:  # SIOCGIFADDR: the interface's address, in a struct ifreq
                packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
        if socket.inet_ntoa(packed[20:24]) == address:
            return name
    return None


def source_address(address: str, port: int) -> str:
    """The local address this host uses to reach ``address`` (a connected UDP socket sends nothing)."""
    target = socket.getaddrinfo(address, port, socket.AF_INET, socket.SOCK_DGRAM)[0][4][0]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((target, port))
        return sock.getsockname()[0]


# ----------------------------------------------------------------------------------------- role
def clean_stale_socket_dirs(base: str | None = None) -> list[str]:
    """Remove BytePS socket directories of launchers that were killed (their pid is gone)."""
    base = base or tempfile.gettempdir()
    removed = []
    try:
        entries = os.listdir(base)
    except OSError:
        return removed
    for entry in entries:
        if not entry.startswith(SOCKET_DIR_PREFIX):
            continue
        pid = entry[len(SOCKET_DIR_PREFIX):].split("-")[0]
        if not pid.isdigit() or int(pid) == os.getpid() or process_alive(int(pid)):
            continue
        shutil.rmtree(os.path.join(base, entry), ignore_errors=True)
        removed.append(entry)
    return removed


class Role:
    """The role's process: its own process group, killed with the launcher (parent-death signal)."""

    def __init__(self, spec: LaunchSpec, environ: Mapping[str, str]):
        self.spec = spec
        self.environ = environ
        self.proc: subprocess.Popen | None = None
        self.socket_dir: str | None = None

    def command(self) -> list[str]:
        if self.spec.command:
            return list(self.spec.command)
        return list(SERVE_COMMAND)

    def environment(self, node_host: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        spec = self.spec
        # The scheduler binds DMLC_PS_ROOT_URI, so it gets an address it has; a name (a Kubernetes
        # Service, a DNS entry) is what the other hosts connect to, and zmq cannot bind a name.
        root = node_host if spec.role == "scheduler" else spec.scheduler_addr
        interface = spec.interface or interface_of(node_host) or ""
        topology = Topology(num_workers=spec.workers, num_servers=spec.servers, root_uri=root,
                            root_port=spec.port, interface=interface,
                            cluster_id=f"launch-{spec.scheduler_addr}:{spec.port}")
        # This host's own BytePS/ps-lite variables and knobs reach its role (a real host's environment is
        # its configuration), below the launcher's options; the topology is the launcher's.
        own = {k: v for k, v in self.environ.items()
               if (k.startswith(_ROLE_PREFIXES) or is_passthrough(k)) and k not in TOPOLOGY_KEYS}
        own.update(spec.env)
        if spec.schedule:
            own["BYTEPS_SCHEDULER"] = spec.schedule
        own.update(extra or {})
        caller = {k: v for k, v in self.environ.items() if not is_passthrough(k)}
        env = role_environment(role=spec.role, index=(spec.worker_id if spec.role == "worker" else spec.server_id) or 0,
                               node_host=node_host, topology=topology, engine=spec.engine, service_env=own,
                               caller_env=caller, bin_dir=os.path.dirname(sys.executable))
        if "BYTEPS_CPU_ONLY" not in own:
            env.pop("BYTEPS_CPU_ONLY", None)  # BytePS decides: CPU-only when it sees no GPU
        if not interface:
            env.pop("DMLC_INTERFACE", None)
        env["BYTEPS_PROPHET_HOST"] = self.spec.name
        return env

    def start(self, node_host: str, extra: Mapping[str, str] | None = None) -> None:
        env = self.environment(node_host, extra)
        if "BYTEPS_SOCKET_PATH" not in env:
            # BytePS's unix sockets are named by local rank only: two workers sharing a /tmp would
            # bind the same names, and a killed worker leaves them behind. A directory of our own.
            clean_stale_socket_dirs()
            self.socket_dir = tempfile.mkdtemp(prefix=f"{SOCKET_DIR_PREFIX}{os.getpid()}-")
            env["BYTEPS_SOCKET_PATH"] = self.socket_dir
        argv = self.command()
        if shutil.which("setpriv"):
            argv = ["setpriv", "--pdeathsig", "KILL", "--"] + argv
        try:
            self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as err:  # reported as the role's failure, as a shell would: status 127
            say(f"{self.spec.name}: cannot run {self.command()[0]!r}: {err.strerror or err}")
            self.start_failed = 127

    start_failed: int | None = None

    def poll(self) -> int | None:
        if self.start_failed is not None:
            return self.start_failed
        return None if self.proc is None else self.proc.poll()

    @property
    def started(self) -> bool:
        return self.proc is not None or self.start_failed is not None

    def stop(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
                try:
                    proc.wait(STOP_GRACE)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if proc is not None:
            try:  # whatever the role left in its process group
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.socket_dir:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
            self.socket_dir = None


# ------------------------------------------------------------------------------------ launcher
class JobEnded(Exception):
    """The job is decided; ``status`` is every launcher's exit status, ``reason`` the one line."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


@dataclass
class Peer:
    channel: Channel
    address: str
    name: str = "?"
    role: str = ""
    node_host: str = ""
    last_heard: float = field(default_factory=time.monotonic)
    status: int | None = None
    stopped: bool = False

    @property
    def label(self) -> str:
        return f"{self.name} ({self.node_host or self.address})"


class Launcher:
    def __init__(self, spec: LaunchSpec, environ: Mapping[str, str] | None = None):
        self.spec = spec
        self.environ = dict(os.environ if environ is None else environ)
        self.role = Role(spec, self.environ)
        self.selector = selectors.DefaultSelector()

    # ---------------------------------------------------------------- entry
    def run(self) -> int:
        try:
            if self.spec.role == "scheduler":
                return self._coordinate()
            return self._follow()
        finally:
            self.role.stop()
            self.selector.close()

    # ---------------------------------------------------------------- coordinator (scheduler host)
    def _coordinate(self) -> int:
        spec = self.spec
        try:
            node_host = spec.node_host or source_address(spec.scheduler_addr, spec.port)
        except OSError as err:
            raise ConfigError(f"--scheduler-addr {spec.scheduler_addr!r} does not resolve here ({err}); "
                              f"valid: this host's address or a name for it") from None
        try:
            listener = socket.create_server(("", spec.control_port))
        except OSError as err:
            raise ConfigError(f"--control-port {spec.control_port}: cannot listen ({err.strerror or err}); "
                              f"valid: a free port on the scheduler host") from None
        listener.setblocking(False)
        self.selector.register(listener, selectors.EVENT_READ, None)
        peers: list[Peer] = []
        started = time.monotonic()
        expected = spec.servers + spec.workers
        say(f"scheduler at {node_host}:{spec.port}: waiting for {spec.servers} server(s) and {spec.workers} "
            f"worker(s) on control port {spec.control_port}")
        try:
            try:
                self._gather(listener, peers, started, expected)
                self._start_all(peers, node_host)
                status, reason = self._supervise(listener, peers, started)
            except JobEnded as end:
                status, reason = end.status, end.reason
            for peer in peers:
                peer.channel.send(end=status, reason=reason)
            self.role.stop()
            say(f"{reason}; job ended (exit {status})")
            return status
        except BaseException:  # Ctrl-C, SIGTERM: every host stops its role
            for peer in peers:
                peer.channel.send(end=130, reason="the scheduler host's launcher was stopped")
            raise
        finally:
            listener.close()

    def _beat(self, peers: list[Peer], last: list[float]) -> None:
        now = time.monotonic()
        if now - last[0] >= HEARTBEAT_S:
            for peer in peers:
                peer.channel.send(beat=1)
            last[0] = now
        for peer in peers:
            if now - peer.last_heard > self.spec.heartbeat_timeout and not (peer.status is not None and peer.stopped):
                raise JobEnded(1, f"{peer.label} lost: no word from its launcher for "
                                  f"{self.spec.heartbeat_timeout:g}s (host down or unreachable)")

    def _receive(self, listener, peers: list[Peer], accepting: bool) -> list[tuple[Peer, dict]]:
        got: list[tuple[Peer, dict]] = []
        for key, _ in self.selector.select(0.1):
            if key.data is None:
                try:
                    conn, addr = listener.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                if not accepting:  # a host launched after the job started: tell it, not part of this job
                    Channel(conn).send(reject="the job had already started without it (every host must be "
                                              "launched before the scheduler host starts the job)")
                    conn.close()
                    continue
                conn.setblocking(False)
                peer = Peer(Channel(conn), addr[0])
                peers.append(peer)
                self.selector.register(conn, selectors.EVENT_READ, peer)
                continue
            peer = key.data
            try:
                messages = peer.channel.receive()
            except ValueError:  # not our wire format: a stranger's connection is dropped, a host's line ignored
                messages = None if peer.name == "?" else []
            if messages is None:
                self.selector.unregister(peer.channel.sock)
                peers.remove(peer)
                peer.channel.sock.close()
                if peer.name == "?":
                    continue  # never said hello: a stray connection
                if peer.status not in (None, 0):
                    raise JobEnded(exit_code(peer.status), f"{peer.label} failed: {describe_status(peer.status)}")
                if peer.status == 0 and peer.stopped:
                    continue
                raise JobEnded(1, f"{peer.label} lost: its launcher's connection closed (killed?)")
            peer.last_heard = time.monotonic()
            got += [(peer, message) for message in messages]
        return got

    def _gather(self, listener, peers: list[Peer], started: float, expected: int) -> None:
        spec = self.spec
        last = [0.0]
        taken: dict[str, Peer] = {}
        while len(taken) < expected:
            if time.monotonic() - started > spec.connect_timeout:
                missing = self._missing(taken)
                raise JobEnded(1, f"{', '.join(missing)} never reached the scheduler host in "
                                  f"{spec.connect_timeout:g}s (connected: {', '.join(sorted(taken)) or 'none'})")
            try:
                messages = self._receive(listener, peers, accepting=True)
            except JobEnded as end:
                raise JobEnded(end.status, end.reason.replace(" lost:", " left before the job started:"))
            for peer, message in messages:
                if "hello" in message and peer.name == "?":
                    try:
                        self._welcome(peer, message, taken)
                    except (TypeError, ValueError):  # a hello we cannot read: not one of our launchers
                        self.selector.unregister(peer.channel.sock)
                        peer.channel.sock.close()
                        peers.remove(peer)
            self._beat([p for p in peers if p.name != "?"], last)

    def _missing(self, taken: Mapping[str, Peer]) -> list[str]:
        names = [host_name("server", i) for i in range(self.spec.servers)]
        names += [host_name("worker", i) for i in range(self.spec.workers)]
        return [name for name in names if name not in taken]

    def _welcome(self, peer: Peer, hello: dict, taken: dict[str, Peer]) -> None:
        spec = self.spec
        role = str(hello.get("role", ""))
        peer.role, peer.node_host = role, str(hello.get("node_host") or peer.address)
        where = f"{role} at {peer.node_host}"
        mine = {"workers": spec.workers, "servers": spec.servers, "engine": spec.engine}
        for key, value in mine.items():
            if hello.get(key) != value:
                raise JobEnded(2, f"{where} was launched with {key} {hello.get(key)!r}, the scheduler with "
                                  f"{value!r}: every host must be launched with the same --workers, "
                                  f"--servers and --engine")
        if role == "worker":
            name = host_name("worker", int(hello.get("index", 0)))
        elif role == "server":
            index = hello.get("index")
            if index is None:  # the next free server number
                index = next(i for i in range(spec.servers + 1) if host_name("server", i) not in taken)
            name = host_name("server", int(index))
        else:
            raise JobEnded(2, f"{where} is a second scheduler; valid: one scheduler per job")
        if name in taken:
            other = taken[name]
            raise JobEnded(2, f"{name} was launched twice ({other.node_host or other.address} and "
                              f"{peer.node_host}); valid: each worker id (and server id) once")
        if role == "server" and int(name.split("-")[1]) >= spec.servers:
            raise JobEnded(2, f"{where} is one server more than --servers {spec.servers}")
        peer.name = name
        taken[name] = peer
        say(f"{name} connected from {peer.node_host} ({len(taken)}/{spec.servers + spec.workers})")

    def _start_all(self, peers: list[Peer], node_host: str) -> None:
        for stray in [p for p in peers if p.name == "?"]:  # connected, never said hello: not a host
            self.selector.unregister(stray.channel.sock)
            stray.channel.sock.close()
            peers.remove(stray)
        worker0 = next(p for p in peers if p.name == "worker-0")
        extra = {"MASTER_ADDR": worker0.node_host, "MASTER_PORT": str(ORDER_CHANNEL_PORT)}
        self.role.start(node_host)
        for peer in peers:
            peer.channel.send(start=extra if peer.role == "worker" else {}, name=peer.name)
        say(f"all {len(peers) + 1} hosts connected; job started")

    def _supervise(self, listener, peers: list[Peer], started: float) -> tuple[int, str]:
        spec = self.spec
        last = [0.0]
        workers_done_at = None
        early_since = None
        everyone = list(peers)
        own: int | None = None
        while True:
            if spec.timeout is not None and time.monotonic() - started > spec.timeout:
                running = [p.name for p in everyone if p.status is None]
                raise JobEnded(124, f"the job took longer than --timeout {spec.timeout:g}s (still running: "
                                    f"{', '.join(running) or 'none'})")
            for peer, message in self._receive(listener, peers, accepting=False):
                if "exit" in message:
                    peer.status = int(message["exit"])
                    if peer.status != 0:
                        why = message.get("why")
                        raise JobEnded(exit_code(peer.status), f"{peer.label} failed: "
                                                               f"{why or describe_status(peer.status)}")
            if own is None:
                own = self.role.poll()
                if own not in (None, 0):
                    raise JobEnded(exit_code(own), f"scheduler failed: {describe_status(own)}")
            self._beat(peers, last)
            now = time.monotonic()
            workers = [p for p in everyone if p.role == "worker"]
            if all(p.status == 0 for p in workers):
                workers_done_at = workers_done_at or now
                lingering = [p for p in everyone if p.role == "server" and p.status is None]
                if own is None or lingering:
                    if now - workers_done_at <= spec.grace:
                        continue
                    for peer in lingering:
                        peer.stopped = True
                        peer.channel.send(stop=1)
                    say(f"{', '.join([p.name for p in lingering] + (['scheduler'] if own is None else []))} "
                        f"still running {spec.grace:g}s after the workers finished: stopped")
                return 0, f"all {len(workers)} workers succeeded"
            ended = (["scheduler"] if own == 0 else []) + [p.name for p in everyone
                                                          if p.role == "server" and p.status == 0]
            if ended:
                early_since = early_since or now
                if now - early_since > EXIT_GRACE:
                    raise JobEnded(1, f"{ended[0]} ended while workers still run")

    # ---------------------------------------------------------------- other hosts
    def _connect(self) -> socket.socket:
        spec = self.spec
        deadline = time.monotonic() + spec.connect_timeout
        last_error = ""
        while True:
            try:
                return socket.create_connection((spec.scheduler_addr, spec.control_port), timeout=2.0)
            except OSError as err:
                last_error = str(err.strerror or err)
            if time.monotonic() > deadline:
                raise JobEnded(1, f"cannot reach the scheduler host {spec.scheduler_addr}:{spec.control_port} "
                                  f"after {spec.connect_timeout:g}s ({last_error}); is its launcher running?")
            time.sleep(0.3)

    def _follow(self) -> int:
        spec = self.spec
        name = spec.name
        channel = None
        try:
            sock = self._connect()
            node_host = spec.node_host or sock.getsockname()[0]
            sock.setblocking(False)
            channel = Channel(sock, "scheduler")
            channel.send(hello=name, role=spec.role, index=spec.worker_id if spec.role == "worker" else spec.server_id,
                         workers=spec.workers, servers=spec.servers, engine=spec.engine, node_host=node_host)
            self.selector.register(sock, selectors.EVENT_READ)
            say(f"{name} at {node_host}: connected to the scheduler host {spec.scheduler_addr}:{spec.control_port}")
            return self._follow_loop(channel, node_host)
        except JobEnded as end:
            say(f"{name}: {end.reason}; role stopped (exit {end.status})")
            return end.status
        except BaseException:
            if channel is not None:  # Ctrl-C, SIGTERM: the coordinator names this host
                self.role.stop()
                channel.send(exit=130, why="its launcher was stopped (interrupted)")
            raise

    def _follow_loop(self, channel: Channel, node_host: str) -> int:
        spec = self.spec
        heard = sent = time.monotonic()
        reported = False
        where = f"{spec.scheduler_addr}:{spec.control_port}"
        while True:
            now = time.monotonic()
            if now - sent >= HEARTBEAT_S:
                channel.send(beat=1)
                sent = now
            if now - heard > spec.heartbeat_timeout:
                raise JobEnded(1, f"scheduler lost: no word from the scheduler host {where} for "
                                  f"{spec.heartbeat_timeout:g}s (host down or unreachable)")
            if self.role.started and not reported:
                status = self.role.poll()
                if status is not None:
                    reported = True
                    channel.send(exit=status)
                    if status != 0:
                        self.role.stop()
                        say(f"{spec.name} failed: {describe_status(status)}; job ended (exit {exit_code(status)})")
                        return exit_code(status)
            for _key, _ in self.selector.select(0.1):
                try:
                    messages = channel.receive()
                except ValueError:
                    messages = []
                if messages is None:
                    raise JobEnded(1, f"scheduler lost: the scheduler host {where} closed the connection "
                                      f"(its launcher ended or was killed)")
                heard = time.monotonic()
                for message in messages:
                    if "start" in message:
                        self.spec = spec = replace(spec, server_id=int(str(message["name"]).split("-")[1])) \
                            if spec.role == "server" else spec
                        self.role.spec = spec
                        self.role.start(node_host, message["start"])
                    elif "stop" in message:
                        self.role.stop()
                        if not reported:
                            reported = True
                            channel.send(exit=0)
                    elif "end" in message:
                        self.role.stop()
                        status = int(message["end"])
                        say(f"{spec.name}: {message.get('reason', 'the job ended')}; job ended (exit {status})")
                        return status
                    elif "reject" in message:
                        raise JobEnded(2, str(message["reject"]))


def run(spec: LaunchSpec, environ: Mapping[str, str] | None = None) -> int:
    return Launcher(spec, environ).run()


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
        if key.startswith(_ROLE_PREFIXES + ("ENGINE",)):
            lines.append(f"    {key}={env[key]}")
    return "\n".join(lines)

