"""One host of a launched job (``deploy/launch.py``): its role's process, its addresses, and how the
launcher speaks (one line on stderr, exit statuses as a shell gives them)."""
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
from typing import TYPE_CHECKING, Mapping

from byteps_prophet.cluster.netns import process_alive
from byteps_prophet.cluster.roles import SERVE_COMMAND, TOPOLOGY_KEYS, Topology, is_passthrough, role_environment

if TYPE_CHECKING:
    from byteps_prophet.deploy.launch import LaunchSpec

HEARTBEAT_S = 1.0          # how often each side says it is alive
STOP_GRACE = 3.0           # SIGTERM -> SIGKILL for a role
# How long workers may still run after the scheduler or a server ended cleanly: a normal BytePS
# shutdown once every worker called shutdown(), and a worker's own exit can take seconds after it.
EXIT_GRACE = 20.0
SOCKET_DIR_PREFIX = "bpp-launch-"
# Variables a host's environment passes to its role as they are (BytePS's, ps-lite's, the knobs).
ROLE_PREFIXES = ("DMLC_", "BYTEPS_", "BYTESCHEDULER_", "PROPHET_")


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


class JobEnded(Exception):
    """The job is decided; ``status`` is every launcher's exit status, ``reason`` the one line."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


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
               if (k.startswith(ROLE_PREFIXES) or is_passthrough(k)) and k not in TOPOLOGY_KEYS}
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


class Launcher:
    """What the coordinator and a follower share: this host's role, the sockets it watches, and that
    both are stopped however the launch ends."""

    def __init__(self, spec: LaunchSpec, environ: Mapping[str, str] | None = None):
        self.spec = spec
        self.environ = dict(os.environ if environ is None else environ)
        self.role = Role(spec, self.environ)
        self.selector = selectors.DefaultSelector()

    def run(self) -> int:
        try:
            return self._launch()
        finally:
            self.role.stop()
            self.selector.close()

    def _launch(self) -> int:
        raise NotImplementedError
