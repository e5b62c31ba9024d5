"""A multi-host BytePS cluster on one machine: one network namespace per host, tc-shaped links.

    with Cluster(ClusterSpec(workers=2, servers=1, bandwidth="1gbit", engine="mxnet")) as cluster:
        result = cluster.run(["python", "train.py"], env={"BYTEPS_SCHEDULER": "prophet"})
        job = cluster.launch(["python", "train.py"])      # non-blocking
        cluster.set_bandwidth("200mbit")                   # tc change while it runs
        result = job.wait(timeout=300)

The hosts, links and shaping (``network.py``) live as long as the :class:`Cluster`; every :meth:`Cluster.run` starts a
fresh scheduler, servers and workers inside them (a ps-lite job serves one run), so one cluster serves
many interleaved runs. Each role runs in its own PID and mount namespace with a private /dev/shm;
when its launcher dies the role dies with it (parent-death signal), and when a run ends every process
left in a host namespace is killed. :meth:`Cluster.close` removes the namespaces, and with them the
links and qdiscs; nothing is ever created in the root namespace.
"""
from __future__ import annotations

import argparse
import itertools
import os
import shutil
import subprocess
import sys
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from byteps_prophet.backends.rendezvous import ORDER_CHANNEL_PORT  # worker 0's order channel (a socket)
from byteps_prophet.cluster import netns as nets
from byteps_prophet.cluster.compose import ComposeDefinition, ServiceDef, load_compose
from byteps_prophet.cluster.shaped_network import Network, check_tcp_congestion
from byteps_prophet.cluster.processes import (
    ISOLATE, INIT_SCRIPT, Ending, Job, OutputSink, PrintSink, RoleProcess, RunResult, Spawner, free_port,
)
from byteps_prophet.cluster.roles import (
    DEFAULT_PORT, Topology, check_engine, check_run_env, host_name, role_command, role_environment,
)
from byteps_prophet.units import format_bandwidth, format_latency, parse_bandwidth, parse_latency
from byteps_prophet.errors import ConfigError, UserError

MAX_HOSTS = 250
_SEQ = itertools.count()
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


def _count(what: str, value: int | None, default: int) -> int:
    count = default if value is None else value
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"--{what} {value!r} must be an integer >= 1")
    return count


def plan_hosts(spec: ClusterSpec, definition: ComposeDefinition, workers: int, servers: int) -> list[Host]:
    """The hosts, in address order: the scheduler (with a parameter server), the servers, the
    workers; each from its compose service, its link shaped as the spec says, else as the service's
    LINK_BANDWIDTH and LINK_LATENCY."""
    if 1 + workers + servers > MAX_HOSTS:
        raise ConfigError(f"{1 + workers + servers} hosts is more than the "
                          f"{MAX_HOSTS} this cluster supports; lower --workers/--servers")
    bandwidth = parse_bandwidth(spec.bandwidth, "--bandwidth") if spec.bandwidth is not None else None
    latency = parse_latency(spec.latency, "--latency") if spec.latency is not None else None
    plan = [("scheduler", 0)] if spec.parameter_server else []
    plan += [("server", i) for i in range(servers)] + [("worker", i) for i in range(workers)]
    hosts = []
    for number, (role, index) in enumerate(plan):
        service = definition.template(role, index)
        where = f"service {service.name}"
        bits = bandwidth if spec.bandwidth is not None else parse_bandwidth(
            service.environment.get("LINK_BANDWIDTH"), f"{where} LINK_BANDWIDTH")
        delay = latency if latency is not None else parse_latency(
            service.environment.get("LINK_LATENCY"), f"{where} LINK_LATENCY")
        hosts.append(Host(host_name(role, index), role, index, nets.host_address(number), service, bits, delay))
    return hosts


def check_engine_installed(python: str, engine: str) -> None:
    """A one-line error unless ``python`` can import the parameter-server engine ``engine``."""
    module = {"byteps": "byteps", "mxnet": "mxnet"}[engine]
    probe = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 3)"
    try:
        proc = subprocess.run([python, "-c", probe], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise UserError(f"cannot run {python}: {err}") from None
    if proc.returncode != 0:
        hint = "build it with scripts/build_byteps.sh, or use --engine mxnet" if module == "byteps" \
            else "pip install mxnet==1.9.1, or use --engine byteps"
        raise UserError(f"engine {engine}: module {module!r} is not importable by {python}; {hint}")


class Cluster:
    """The hosts of a compose file on this machine, and runs on them; see the module docstring.

    It plans the hosts (roles, addresses, shaping from the compose file and the spec), builds their
    network (``network.Network``) or chooses plain loopback, and starts each run's roles with their
    environment and command (``processes.Job`` watches them)."""

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
        self.num_workers = _count("workers", self.spec.workers, len(self.definition.workers))
        self.num_servers = (_count("servers", self.spec.servers, len(self.definition.servers))
                            if self.spec.parameter_server else 0)
        self.hosts: list[Host] = plan_hosts(self.spec, self.definition, self.num_workers, self.num_servers)
        self.use_netns: bool | None = None
        self.id: str | None = None
        self.network: Network | None = None
        self.port: int | None = None
        self._order_port: int | None = None
        self._namespaces: list[str] = []
        self._job: Job | None = None
        self._lock = threading.RLock()
        self._spawner: Spawner | None = None
        self._isolate_roles = False
        self._finalizer = None
        self.closed = False

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
        if self.spec.parameter_server:  # else no engine runs: the workers run only the caller's command
            check_engine_installed(self.python, self.engine)
        reason = None if self.spec.netns is False else nets.unavailable_reason()
        if reason:  # never a silent fall-back: unshaped links would pass for shaped ones
            raise UserError(f"cannot build a namespace cluster: {reason}; pass --no-netns to run on plain "
                            f"loopback without link shaping (bandwidth and latency NOT applied)")
        self.use_netns = reason is None and self.spec.netns is not False
        check_tcp_congestion(self.spec.tcp_congestion, self.use_netns)
        self._isolate_roles = (hasattr(os, "geteuid") and os.geteuid() == 0
                               and shutil.which("unshare") is not None)
        self._spawner = Spawner()
        self.id = f"{nets.PREFIX}-{os.getpid()}-{next(_SEQ)}"
        self._finalizer = weakref.finalize(self, _emergency_teardown, self._namespaces, self._spawner)
        try:
            if self.use_netns:
                self.network = Network(self.id, self.hosts, self._namespaces, self.spec.tcp_congestion)
                self.network.build()
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
        if self.network is not None:
            return self.network.tcp_congestion()
        return nets.tcp_congestion(None)

    def set_bandwidth(self, rate: str | int | None) -> None:
        """Change every link (both directions) to ``rate`` now; works while a run is in progress."""
        bits = parse_bandwidth(rate, "bandwidth")
        with self._lock:
            self._require_shaping("set_bandwidth")
            self.network.set_bandwidth(bits)

    def set_latency(self, latency: str | int | None) -> None:
        """Change the one-way host-to-host delay of every link (needs netem)."""
        micros = parse_latency(latency, "latency")
        with self._lock:
            self._require_shaping("set_latency")
            self.network.set_latency(micros)

    def network_counters(self) -> dict:
        """Cumulative counters of every shaped link and host (empty on loopback): per host, ``up``
        (its eth0's egress) and ``down`` (the switch's port towards it) qdisc counters (bytes, packets,
        drops, overlimits, requeues) and ``tcp`` (out_segs, retrans_segs, timeouts, ...). Take it
        before and after a run; ``netns.counter_delta`` gives what the run did."""
        with self._lock:
            if self.closed or self.network is None:
                return {}
            return self.network.counters()

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
            argv += ISOLATE + ["sh", "-c", INIT_SCRIPT, host.name]
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
            roles: list[RoleProcess] = []

            def spawn_all():
                for host, argv, role_env in plans:
                    try:
                        proc = subprocess.Popen(argv, env=role_env, stdin=subprocess.DEVNULL,
                                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                start_new_session=True, cwd=os.getcwd())
                    except FileNotFoundError:
                        raise UserError(f"{host.name}: command not found: {argv[0]!r} (PATH starts with "
                                        f"{self.bin_dir})") from None
                    roles.append(RoleProcess(host, proc, sink))

            try:
                self._spawner.call(spawn_all)
            except BaseException:
                Job(roles, timeout, self._ending())._stop_all()
                raise
            self._job = Job(roles, timeout, self._ending())
            return self._job

    def _ending(self) -> Ending:
        return Ending(grace=self.spec.grace, exit_grace=self.spec.exit_grace, stop_grace=self.spec.stop_grace,
                      sweep_groups=not self._isolate_roles, kill_leftovers=self._kill_leftovers)

    def run(self, command: Sequence[str] | str | None = None, env: Mapping[str, str] | None = None,
            timeout: float | None = None, output: OutputSink | bool | None = None) -> RunResult:
        """One run: launch, wait, stop what is left. Never raises for a failed role: see the result."""
        return self.launch(command, env, timeout, output).wait()

    def _sink(self, output: OutputSink | bool | None) -> OutputSink | None:
        choice = self._output if output is None else output
        if choice is False:
            return None
        if choice is None or choice is True:
            return PrintSink(width=max(len(h.name) for h in self.hosts))
        return choice

    def _kill_leftovers(self) -> None:
        if self.network is not None:
            self.network.kill_processes()

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


def _emergency_teardown(namespaces: list[str], spawner: Spawner | None) -> None:
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
