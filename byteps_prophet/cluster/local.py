"""A multi-host BytePS cluster on one machine: one network namespace per host, tc-shaped links.

    with Cluster(ClusterSpec(workers=2, servers=1, bandwidth="1gbit", engine="mxnet")) as cluster:
        result = cluster.run(["python", "train.py"], env={"BYTEPS_SCHEDULER": "prophet"})
        job = cluster.launch(["python", "train.py"])      # non-blocking
        cluster.set_bandwidth("200mbit")                   # tc change while it runs
        result = job.wait(timeout=300)

The hosts, links and shaping live as long as the :class:`Cluster`; every :meth:`Cluster.run` starts a
fresh scheduler, servers and workers inside them (a ps-lite job serves one run), so one cluster serves
many interleaved runs. Each role runs in its own PID and mount namespace with a private /dev/shm;
when its launcher dies the role dies with it (parent-death signal), and when a run ends every process
left in a host namespace is killed. :meth:`Cluster.close` removes the namespaces, and with them the
links and qdiscs; nothing is ever created in the root namespace.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import itertools
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from byteps_prophet.backends.rendezvous import ORDER_CHANNEL_PORT  # worker 0's order channel (a socket)
from byteps_prophet.cluster import netns as nets
from byteps_prophet.cluster.compose import ComposeDefinition, ServiceDef, load_compose
from byteps_prophet.cluster.roles import (
    DEFAULT_PORT, Topology, check_engine, check_run_env, host_name, role_command, role_environment,
)
from byteps_prophet.units import format_bandwidth, format_latency, parse_bandwidth, parse_latency
from byteps_prophet.errors import ConfigError, UserError

OutputSink = Callable[[str, str], None]
MAX_HOSTS = 250
_SEQ = itertools.count()
# PID 1 of the role's own PID and mount namespaces: mount a private tmpfs on /dev/shm, run the role's
# command as an ordinary process (PID 1 would be immune to its own signals, e.g. a `kill -9 $$`),
# forward SIGTERM to it and exit with its status; the kernel then kills anything it left behind.
# BytePS's unix sockets (BYTEPS_SOCKET_PATH, /tmp by default, shared by every host here) go to that
# private tmpfs too, unless the run sets them: no two hosts collide and a killed role leaves none.
_INIT_SCRIPT = (
    'mount -t tmpfs -o mode=1777 bpp-shm /dev/shm || exit 125\n'
    'export BYTEPS_SOCKET_PATH="${BYTEPS_SOCKET_PATH:-/dev/shm/bpp-sockets}"\n'
    'mkdir -p "$BYTEPS_SOCKET_PATH" || exit 125\n'
    '"$@" & child=$!\n'
    'trap \'kill -TERM $child 2>/dev/null\' TERM INT HUP\n'
    'while :; do wait $child; status=$?; kill -0 $child 2>/dev/null || exit $status; done\n'
)
_ISOLATE = ["unshare", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc",
            "--propagation", "private", "--"]


@dataclass(frozen=True)
class ClusterSpec:
    """What to build. ``None`` means: take it from the compose file."""

    workers: int | None = None          # number of worker hosts (compose: its worker services)
    servers: int | None = None          # number of server hosts (compose: its server services)
    bandwidth: str | int | None = None  # per link and direction, tc units; 'none' = unshaped
    latency: str | int | None = None    # one-way host-to-host delay (netem), e.g. 1ms, 500us
    engine: str | None = None           # byteps or mxnet (compose: ENGINE, else byteps)
    compose: str | os.PathLike | None = None  # compose file (default docker/docker-compose.yml)
    netns: bool | None = None           # False: plain loopback; True or None: namespaces, or a one-line error
    # TCP congestion control of every host (namespaces only), e.g. cubic, bbr; None: the host's, as
    # containers on a machine get it. It decides how workers out of step share a link (docs/CLUSTER.md).
    tcp_congestion: str | None = None
    # False: workers only, no scheduler or servers (torch.distributed, e.g. gloo); each worker gets
    # RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR (worker-0) and MASTER_PORT (the cluster's port).
    parameter_server: bool = True
    port: int | None = None             # scheduler port (compose: DMLC_PS_ROOT_PORT, else 9000)
    grace: float = 5.0                  # how long scheduler/servers may linger after the workers
    # How long workers may still run after the scheduler or a server exited cleanly (status 0). That
    # is a normal BytePS shutdown once every worker called shutdown(); a worker's own exit can take
    # several seconds after that on a busy machine (BytePS tears down its threads and shared memory).
    exit_grace: float = 20.0
    stop_grace: float = 2.0             # SIGTERM -> SIGKILL


@dataclass
class Host:
    name: str
    role: str
    index: int
    address: str
    service: ServiceDef
    bandwidth: int | None   # bits/s per direction, None = unshaped
    latency_us: int         # one-way host-to-host delay the link adds (half on each end)
    netns: str | None = None
    switch_dev: str | None = None


@dataclass
class RunResult:
    returncode: int                  # 0, the failing role's status (128+signal if killed), 124 on timeout
    failed: str | None               # name of the role that ended the run, if it failed
    reason: str                      # one line: what happened
    elapsed: float                   # seconds from launch until everything had stopped
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    output: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def _status_code(code: int) -> int:
    return 128 - code if code < 0 else code


def _signal_name(number: int) -> str | None:
    try:
        return signal.Signals(number).name
    except ValueError:
        return None


def _describe_exit(name: str, code: int) -> str:
    """``-9`` (Popen) or ``137`` (the shell's 128+N, as the role's init reports it) -> killed by SIGKILL."""
    if code < 0:
        return f"{name} was killed by {_signal_name(-code) or f'signal {-code}'}"
    if code > 128 and _signal_name(code - 128):
        return f"{name} was killed by {_signal_name(code - 128)} (status {code})"
    return f"{name} exited with status {code}"


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (for a scheduler, a gloo rendezvous, ...)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _PrintSink:
    """Writes ``name | line`` to a stream, one whole line at a time."""

    def __init__(self, stream=None, width: int = 9):
        self._stream = stream
        self._width = width
        self._lock = threading.Lock()

    def __call__(self, name: str, line: str) -> None:
        stream = self._stream or sys.stdout
        with self._lock:
            stream.write(f"{name:<{self._width}} | {line}\n")
            stream.flush()


class _Spawner:
    """Starts every role from one long-lived thread.

    The roles carry a parent-death signal (setpriv --pdeathsig), which the kernel ties to the thread
    that forked them; forking from this thread makes them die with the controller process, not with
    whichever caller thread happened to launch them.
    """

    def __init__(self):
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="bpp-cluster-spawner", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, future = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as err:  # noqa: BLE001 - handed to the caller
                    future.set_exception(err)

    def call(self, fn):
        """Run ``fn`` on the spawner thread; if the caller is interrupted, still wait for ``fn`` to end
        (so that nothing it starts can be missed by the clean-up that follows) before re-raising."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((fn, future))
        try:
            return future.result()
        except BaseException:
            concurrent.futures.wait([future], timeout=60)
            raise

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)


class _Role:
    def __init__(self, host: Host, proc: subprocess.Popen, sink: OutputSink | None, keep: int = 2000):
        self.host = host
        self.proc = proc
        self.lines: collections.deque[str] = collections.deque(maxlen=keep)
        self._sink = sink
        self.reader = threading.Thread(target=self._read, name=f"bpp-{host.name}-output", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        stream = self.proc.stdout
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            self.lines.append(line)
            if self._sink is not None:
                try:
                    self._sink(self.host.name, line)
                except Exception:  # noqa: BLE001 - a broken sink must not stop the draining
                    self._sink = None
        stream.close()

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class Job:
    """One run of scheduler, servers and workers on the cluster's hosts."""

    def __init__(self, cluster: "Cluster", roles: list[_Role], timeout: float | None):
        self._cluster = cluster
        self.roles = roles
        self.started = time.monotonic()
        self.timeout = timeout
        self.result: RunResult | None = None
        self._early_since: float | None = None
        self._workers_done_at: float | None = None
        self._lock = threading.Lock()

    @property
    def names(self) -> list[str]:
        return [role.host.name for role in self.roles]

    def _finish(self, returncode: int, failed: str | None, reason: str) -> RunResult:
        self._stop_all()
        self.result = RunResult(
            returncode=returncode, failed=failed, reason=reason,
            elapsed=time.monotonic() - self.started,
            exit_codes={r.host.name: r.proc.returncode for r in self.roles},
            output={r.host.name: list(r.lines) for r in self.roles},
        )
        return self.result

    def _stop_all(self) -> None:
        grace = self._cluster.spec.stop_grace
        running = [r for r in self.roles if r.proc.poll() is None]
        for role in running:
            role.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while running and time.monotonic() < deadline:
            running = [r for r in running if r.proc.poll() is None]
            time.sleep(0.02)
        for role in running:
            role.signal(signal.SIGKILL)
        for role in self.roles:
            try:
                role.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if not self._cluster._isolate_roles:
            # No PID namespace to collapse: sweep each role's process group for children that
            # outlived the role's main process.
            for role in self.roles:
                role.signal(signal.SIGKILL)
        self._cluster._kill_leftovers()
        for role in self.roles:
            role.reader.join(timeout=2)

    def poll(self) -> RunResult | None:
        """Check the roles once; returns the result when the run has ended (and stops what is left)."""
        with self._lock:
            if self.result is not None:
                return self.result
            now = time.monotonic()
            codes = {r.host.name: r.proc.poll() for r in self.roles}
            order = sorted(self.roles, key=lambda r: {"worker": 0, "server": 1, "scheduler": 2}[r.host.role])
            for role in order:
                code = codes[role.host.name]
                if code not in (None, 0):
                    return self._finish(_status_code(code), role.host.name,
                                        _describe_exit(role.host.name, code))
            workers = [r for r in self.roles if r.host.role == "worker"]
            others = [r for r in self.roles if r.host.role != "worker"]
            if all(codes[r.host.name] == 0 for r in workers):
                if self._workers_done_at is None:
                    self._workers_done_at = now
                lingering = [r.host.name for r in others if codes[r.host.name] is None]
                if not lingering:
                    return self._finish(0, None, f"all {len(workers)} workers succeeded")
                if now - self._workers_done_at > self._cluster.spec.grace:
                    return self._finish(0, None, f"all {len(workers)} workers succeeded "
                                                 f"(stopped {', '.join(lingering)} after {self._cluster.spec.grace:g}s)")
                return None
            early = [r.host.name for r in others if codes[r.host.name] == 0]
            if early:
                if self._early_since is None:
                    self._early_since = now
                elif now - self._early_since > self._cluster.spec.exit_grace:
                    running = [r.host.name for r in workers if codes[r.host.name] is None]
                    return self._finish(1, early[0], f"{early[0]} exited before the workers finished "
                                                     f"({', '.join(running)} still running)")
            if self.timeout is not None and now - self.started > self.timeout:
                running = [name for name, code in codes.items() if code is None]
                return self._finish(124, None, f"timed out after {self.timeout:g}s "
                                               f"(still running: {', '.join(running)})")
            return None

    def wait(self, timeout: float | None = None) -> RunResult:
        """Block until the run ends. ``timeout`` (seconds) overrides the launch timeout; Ctrl-C stops all."""
        if timeout is not None:
            self.timeout = timeout
        try:
            while True:
                result = self.poll()
                if result is not None:
                    return result
                time.sleep(0.05)
        except BaseException:
            self.stop("interrupted")
            raise

    def stop(self, reason: str = "stopped") -> RunResult:
        with self._lock:
            if self.result is not None:
                return self.result
            return self._finish(130 if reason == "interrupted" else 143, None, reason)


class Cluster:
    """Hosts (namespaces), links and shaping; see the module docstring."""

    def __init__(self, spec: ClusterSpec | None = None, *, environ: Mapping[str, str] | None = None,
                 output: OutputSink | bool | None = None, warn: Callable[[str], None] | None = None,
                 python: str | None = None):
        self.spec = spec or ClusterSpec()
        self.environ = dict(os.environ if environ is None else environ)
        self._output = output
        self._warn = warn or (lambda message: print(message, file=sys.stderr, flush=True))
        self.python = python or sys.executable
        self.bin_dir = str(Path(self.python).parent)
        self.definition: ComposeDefinition = load_compose(self.spec.compose, self.environ)
        self.engine = check_engine(self.spec.engine or self.definition.scheduler.environment.get("ENGINE")
                                   or "byteps")
        self.num_workers = self._count("workers", self.spec.workers, len(self.definition.workers))
        self.num_servers = (self._count("servers", self.spec.servers, len(self.definition.servers))
                            if self.spec.parameter_server else 0)
        if 1 + self.num_workers + self.num_servers > MAX_HOSTS:
            raise ConfigError(f"{1 + self.num_workers + self.num_servers} hosts is more than the "
                              f"{MAX_HOSTS} this cluster supports; lower --workers/--servers")
        bandwidth = (parse_bandwidth(self.spec.bandwidth, "--bandwidth")
                     if self.spec.bandwidth is not None else None)
        latency = parse_latency(self.spec.latency, "--latency") if self.spec.latency is not None else None
        self.hosts: list[Host] = []
        plan = [("scheduler", 0)] if self.spec.parameter_server else []
        plan += [("server", i) for i in range(self.num_servers)] + [("worker", i) for i in range(self.num_workers)]
        for number, (role, index) in enumerate(plan):
            service = self.definition.template(role, index)
            name = host_name(role, index)
            where = f"service {service.name}"
            bits = bandwidth if self.spec.bandwidth is not None else parse_bandwidth(
                service.environment.get("LINK_BANDWIDTH"), f"{where} LINK_BANDWIDTH")
            delay = latency if latency is not None else parse_latency(
                service.environment.get("LINK_LATENCY"), f"{where} LINK_LATENCY")
            self.hosts.append(Host(name, role, index, nets.host_address(number), service, bits, delay))
        self.use_netns: bool | None = None
        self.id: str | None = None
        self.switch: str | None = None
        self.port: int | None = None
        self._order_port: int | None = None
        self._namespaces: list[str] = []
        self._job: Job | None = None
        self._lock = threading.RLock()
        self._spawner: _Spawner | None = None
        self._isolate_roles = False
        self._finalizer = None
        self.closed = False

    @staticmethod
    def _count(what: str, value: int | None, default: int) -> int:
        count = default if value is None else value
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ConfigError(f"--{what} {value!r} must be an integer >= 1")
        return count

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> "Cluster":
        if self.use_netns is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> "Cluster":
        """Create the hosts, links and shaping (or choose plain loopback)."""
        if self.use_netns is not None:
            raise UserError("cluster already started")
        self._check_engine_installed()
        reason = None if self.spec.netns is False else nets.unavailable_reason()
        if reason:  # never a silent fall-back: unshaped links would pass for shaped ones
            raise UserError(f"cannot build a namespace cluster: {reason}; pass --no-netns to run on plain "
                            f"loopback without link shaping (bandwidth and latency NOT applied)")
        self.use_netns = reason is None and self.spec.netns is not False
        self._check_tcp_congestion()
        self._isolate_roles = (hasattr(os, "geteuid") and os.geteuid() == 0
                               and shutil.which("unshare") is not None)
        self._spawner = _Spawner()
        self.id = f"{nets.PREFIX}-{os.getpid()}-{next(_SEQ)}"
        self._finalizer = weakref.finalize(self, _emergency_teardown, self._namespaces, self._spawner)
        try:
            if self.use_netns:
                self._build_network()
                self.port = self.spec.port or int(self.definition.scheduler.environment.get(
                    "DMLC_PS_ROOT_PORT") or DEFAULT_PORT)
            else:
                for host in self.hosts:
                    host.address = "127.0.0.1"
                self.port = self.spec.port or free_port()
        except BaseException:
            self.close()
            raise
        return self

    def tcp_congestion(self) -> str:
        """The TCP congestion control the hosts' connections use (the first host's namespace, or this
        machine's on plain loopback): a condition of every timing the cluster gives."""
        if self.use_netns and self.hosts[0].netns:
            return nets.tcp_congestion(self.hosts[0].netns)
        return nets.tcp_congestion(None)

    def _check_tcp_congestion(self) -> None:
        wanted = self.spec.tcp_congestion
        if wanted is None:
            return
        if not self.use_netns:
            raise UserError(f"--tcp-congestion {wanted}: only the namespace cluster can set it (its hosts' "
                            f"namespaces); valid: no --tcp-congestion with --no-netns")
        available = nets.available_tcp_congestion()
        if wanted not in available:
            raise UserError(f"--tcp-congestion {wanted!r} is not available in this kernel; valid: "
                            f"{', '.join(available)}")
        allowed = nets.allowed_tcp_congestion()
        if wanted not in allowed:
            raise UserError(f"--tcp-congestion {wanted!r} is not allowed in network namespaces on this host; "
                            f"valid: {', '.join(allowed)}, or allow it (as root): sysctl -w "
                            f"net.ipv4.tcp_allowed_congestion_control='{' '.join([*allowed, wanted])}'")

    def _check_engine_installed(self) -> None:
        if not self.spec.parameter_server:
            return  # no engine runs: the workers run only the caller's command
        module = {"byteps": "byteps", "mxnet": "mxnet"}[self.engine]
        probe = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 3)"
        try:
            proc = subprocess.run([self.python, "-c", probe], capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise UserError(f"cannot run {self.python}: {err}") from None
        if proc.returncode != 0:
            hint = "build it with scripts/build_byteps.sh, or use --engine mxnet" if module == "byteps" \
                else "pip install mxnet==1.9.1, or use --engine byteps"
            raise UserError(f"engine {self.engine}: module {module!r} is not importable by {self.python}; {hint}")

    def _build_network(self) -> None:
        nets.clean_stale()
        self.switch = f"{self.id}-sw"
        for host in self.hosts:
            host.netns = f"{self.id}-{host.name}"
            host.switch_dev = host.name
        # Record the names before creating them, so a failure half-way still removes them all.
        self._namespaces.extend(h.netns for h in self.hosts)
        self._namespaces.append(self.switch)
        nets.ip_batch([f"netns add {self.switch}"] + [f"netns add {h.netns}" for h in self.hosts])
        switch_lines = ["link set lo up", f"link add {nets.BRIDGE} type bridge",
                        f"link set {nets.BRIDGE} up"]
        for host in self.hosts:
            switch_lines += [
                f"link add {host.switch_dev} type veth peer name {nets.HOST_DEV} netns {host.netns}",
                f"link set {host.switch_dev} master {nets.BRIDGE}",
                f"link set {host.switch_dev} up",
            ]
        nets.ip_batch(switch_lines, ns=self.switch)
        for host in self.hosts:
            nets.ip_batch(["link set lo up", f"addr add {host.address}/{nets.SUBNET.prefixlen} dev {nets.HOST_DEV}",
                           f"link set {nets.HOST_DEV} up"], ns=host.netns)
            if self.spec.tcp_congestion:
                nets.set_tcp_congestion(host.netns, self.spec.tcp_congestion)
        if any(h.latency_us > 0 for h in self.hosts) and not nets.netem_available(self.switch):
            worst = max(self.hosts, key=lambda h: h.latency_us)
            raise UserError(f"latency {format_latency(worst.latency_us)} needs the netem qdisc, which this "
                            f"kernel lacks (CONFIG_NET_SCH_NETEM); use --latency 0")
        self._apply_shaping()

    def _apply_shaping(self) -> None:
        switch_lines: list[str] = []
        for host in self.hosts:
            half = host.latency_us // 2
            host_lines = nets.shaping_batch(nets.Link(host.netns, nets.HOST_DEV), host.bandwidth, half)
            switch_lines += nets.shaping_batch(nets.Link(self.switch, host.switch_dev), host.bandwidth,
                                               host.latency_us - half)
            self._tc(host_lines, host.netns)
        self._tc(switch_lines, self.switch)

    @staticmethod
    def _tc(lines: list[str], ns: str) -> None:
        deletions = [line for line in lines if line.startswith("qdisc del")]
        if deletions:  # deleting a root qdisc that is not there is fine
            nets.tc_batch(deletions, ns, check=False)
        nets.tc_batch([line for line in lines if not line.startswith("qdisc del")], ns)

    def set_bandwidth(self, rate: str | int | None) -> None:
        """Change every link (both directions) to ``rate`` now; works while a run is in progress."""
        bits = parse_bandwidth(rate, "bandwidth")
        with self._lock:
            self._require_shaping("set_bandwidth")
            for host in self.hosts:
                host.bandwidth = bits
            self._apply_shaping()

    def set_latency(self, latency: str | int | None) -> None:
        """Change the one-way host-to-host delay of every link (needs netem)."""
        micros = parse_latency(latency, "latency")
        with self._lock:
            self._require_shaping("set_latency")
            if micros > 0 and not nets.netem_available(self.switch):
                raise UserError(f"latency {format_latency(micros)} needs the netem qdisc, which this kernel "
                                f"lacks (CONFIG_NET_SCH_NETEM); use 0")
            for host in self.hosts:
                host.latency_us = micros
            self._apply_shaping()

    def network_counters(self) -> dict:
        """Cumulative counters of every shaped link and host (empty on loopback): per host, ``up``
        (its eth0's egress) and ``down`` (the switch's port towards it) qdisc counters (bytes, packets,
        drops, overlimits, requeues) and ``tcp`` (out_segs, retrans_segs, timeouts, ...). Take it
        before and after a run; ``netns.counter_delta`` gives what the run did."""
        with self._lock:
            if self.closed or not self.use_netns:
                return {}
            return {host.name: {"up": nets.qdisc_counters(host.netns, nets.HOST_DEV),
                                "down": nets.qdisc_counters(self.switch, host.switch_dev),
                                "tcp": nets.tcp_counters(host.netns)}
                    for host in self.hosts}

    def _require_shaping(self, what: str) -> None:
        if self.closed or self.use_netns is None:
            raise UserError(f"{what}: the cluster is not started")
        if not self.use_netns:
            raise UserError(f"{what}: this cluster runs on plain loopback (no namespaces), so links "
                            f"cannot be shaped")

    def describe(self) -> str:
        mode = "loopback (unshaped)" if self.use_netns is False else "namespaces"
        lines = [f"cluster {self.id or '(not started)'}: engine {self.engine}, {mode}, "
                 f"compose {self.definition.path}"]
        for host in self.hosts:
            shaping = (f"{format_bandwidth(host.bandwidth)}, +{format_latency(host.latency_us)}"
                       if self.use_netns is not False else "unshaped")
            lines.append(f"  {host.name:<10} {host.address:<15} {shaping:<22} (service {host.service.name})")
        return "\n".join(lines)

    # ------------------------------------------------------------------ runs
    def environment(self, host: Host, run_env: Mapping[str, str] | None = None) -> dict[str, str]:
        if not self.spec.parameter_server:  # torch.distributed's variables; rank 0 hosts the store
            env = {k: v for k, v in self.environ.items() if not k.startswith("DMLC_")}
            env.update(check_run_env(run_env), PYTHONUNBUFFERED="1", RANK=str(host.index),
                       WORLD_SIZE=str(self.num_workers), LOCAL_RANK="0", MASTER_ADDR=self.hosts[0].address,
                       MASTER_PORT=str(self.port or DEFAULT_PORT), DMLC_WORKER_ID=str(host.index),
                       DMLC_NUM_WORKER=str(self.num_workers))
            return env
        topology = Topology(
            num_workers=self.num_workers, num_servers=self.num_servers,
            root_uri=self.hosts[0].address, root_port=self.port or DEFAULT_PORT,
            interface="lo" if self.use_netns is False else nets.HOST_DEV, cluster_id=self.id or "",
        )
        env = role_environment(role=host.role, index=host.index, node_host=host.address, topology=topology,
                               engine=self.engine, service_env=host.service.environment,
                               caller_env=self.environ, run_env=run_env, bin_dir=self.bin_dir)
        if host.role == "worker" and "MASTER_ADDR" not in (run_env or {}):
            # BYTEPS_SCHEDULER=prophet|bytescheduler keeps the workers' order channel in a store that
            # worker 0 hosts (backends/byteps_ps.py): an unmodified script must find it without help.
            env["MASTER_ADDR"] = self.host("worker-0").address
            env["MASTER_PORT"] = str(self._order_channel_port())
        return env

    def _order_channel_port(self) -> int:
        if self._order_port is None:  # every worker host has its own address in namespaces
            self._order_port = ORDER_CHANNEL_PORT if self.use_netns else free_port()
        return self._order_port

    def command(self, host: Host, worker_command: Sequence[str] | None = None) -> tuple[str, ...]:
        return role_command(host.role, host.service.command, worker_command)

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise UserError(f"no host {name!r}; hosts: {', '.join(h.name for h in self.hosts)}")

    def exec_argv(self, name: str, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run inside host ``name``'s network namespace (as is on loopback)."""
        host = self.host(name)
        if self.use_netns:
            return ["ip", "netns", "exec", host.netns] + list(argv)
        return list(argv)

    def _argv(self, host: Host, command: Sequence[str]) -> list[str]:
        argv: list[str] = []
        if shutil.which("setpriv"):
            argv += ["setpriv", "--pdeathsig", "KILL", "--"]
        if self.use_netns:
            argv += ["ip", "netns", "exec", host.netns]
        if self._isolate_roles:
            argv += _ISOLATE + ["sh", "-c", _INIT_SCRIPT, host.name]
        return argv + list(command)

    def launch(self, command: Sequence[str] | str | None = None, env: Mapping[str, str] | None = None,
               timeout: float | None = None, output: OutputSink | bool | None = None) -> Job:
        """Start scheduler, servers and workers; workers run ``command`` (default: the compose command)."""
        if isinstance(command, str):
            command = ["sh", "-c", command]
        check_run_env(env)
        if timeout is not None and timeout <= 0:
            raise ConfigError(f"timeout {timeout!r} must be a positive number of seconds")
        with self._lock:
            if self.closed or self.use_netns is None:
                raise UserError("launch: the cluster is not started (use Cluster(...).start() or 'with')")
            if self._job is not None and self._job.result is None:
                raise UserError("launch: a run is already in progress on this cluster; wait for it first")
            sink = self._sink(output)
            plans = [(host, self._argv(host, self.command(host, command)), self.environment(host, env))
                     for host in self.hosts]
            roles: list[_Role] = []

            def spawn_all():
                for host, argv, role_env in plans:
                    try:
                        proc = subprocess.Popen(argv, env=role_env, stdin=subprocess.DEVNULL,
                                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                start_new_session=True, cwd=os.getcwd())
                    except FileNotFoundError:
                        raise UserError(f"{host.name}: command not found: {argv[0]!r} (PATH starts with "
                                        f"{self.bin_dir})") from None
                    roles.append(_Role(host, proc, sink))

            try:
                self._spawner.call(spawn_all)
            except BaseException:
                job = Job(self, roles, timeout)
                job._stop_all()
                raise
            self._job = Job(self, roles, timeout)
            return self._job

    def run(self, command: Sequence[str] | str | None = None, env: Mapping[str, str] | None = None,
            timeout: float | None = None, output: OutputSink | bool | None = None) -> RunResult:
        """One run: launch, wait, stop what is left. Never raises for a failed role: see the result."""
        return self.launch(command, env, timeout, output).wait()

    def _sink(self, output: OutputSink | bool | None) -> OutputSink | None:
        choice = self._output if output is None else output
        if choice is False:
            return None
        if choice is None or choice is True:
            return _PrintSink(width=max(len(h.name) for h in self.hosts))
        return choice

    def _kill_leftovers(self) -> None:
        if self.use_netns:
            for host in self.hosts:
                nets.kill_namespace_processes(host.netns)

    def close(self) -> None:
        """Stop any run, then remove namespaces, links and qdiscs. Idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if self._job is not None and self._job.result is None:
                self._job.stop("cluster closed")
            left = nets.delete_namespaces(list(self._namespaces)) if self._namespaces else []
            self._namespaces.clear()
            if self._spawner is not None:
                self._spawner.stop()
            if self._finalizer is not None:
                self._finalizer.detach()
            if left:
                raise UserError(f"could not delete namespaces {', '.join(left)}; run "
                                f"'byteps-prophet cluster clean'")


def _emergency_teardown(namespaces: list[str], spawner: _Spawner | None) -> None:
    """Garbage collection or interpreter exit without close(): remove what is left."""
    if namespaces:
        nets.delete_namespaces(list(namespaces))
        namespaces.clear()
    if spawner is not None:
        spawner.stop()


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def launcher_main(prog: str, description: str, add_options: Callable[[argparse.ArgumentParser], None],
                  run: Callable[[argparse.Namespace, list[str]], RunResult], argv: list[str] | None = None,
                  timeout: float | None = None) -> int:
    """The loopback launchers' command line: ``PROG [options] [--timeout SEC] -- COMMAND...``.

    ``run(args, command)`` runs the job (a loopback :class:`Cluster`). A bad argument is one line and
    exit 2; a failed run prints its reason (it names the failed role) and exits with its status.
    """
    parser = _OneLineParser(prog=prog, description=description)
    add_options(parser)
    parser.add_argument("--timeout", type=float, default=timeout, metavar="SEC",
                        help=f"stop everything after SEC seconds, exit 124 (default: {timeout or 'none'})")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND...", help="what each worker runs")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("a worker COMMAND is required after --")
    try:
        result = run(args, command)
    except UserError as err:
        parser.error(str(err))
    if not result.ok:
        print(f"launch: {result.reason}; everything stopped after {result.elapsed:.2f}s (exit {result.returncode})",
              file=sys.stderr)
    return result.returncode
