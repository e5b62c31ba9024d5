"""Environment per role, role commands, tc commands and the cluster's validation (no root needed)."""
import ipaddress
import subprocess
import sys

import pytest

from byteps_prophet import cli
from byteps_prophet.cluster import netns
from byteps_prophet.cluster.local import Cluster, ClusterSpec
from byteps_prophet.cluster.processes import describe_exit
from byteps_prophet.cluster.roles import (
    SELFTEST_COMMAND, SERVE_COMMAND, Topology, check_run_env, role_command, role_environment,
)
from byteps_prophet.errors import ConfigError, UserError

TOPOLOGY = Topology(num_workers=3, num_servers=2, root_uri="198.18.1.1", root_port=9000,
                    interface="eth0", cluster_id="bpp-1-0")
CALLER = {"PATH": "/usr/bin", "HOME": "/root", "BYTEPS_SCHEDULER": "prophet", "PROPHET_MODE": "paper",
          "BYTESCHEDULER_CREDIT": "4", "DMLC_ROLE": "stale", "BYTEPS_LOG_LEVEL": "DEBUG",
          "DMLC_NUM_WORKER": "99", "BYTEPS_PROPHET_ATOM_ELEMENTS": "250000", "BYTEPS_PROPHET_HOST": "stale"}


def env_for(role, index, **kw):
    args = dict(role=role, index=index, node_host="198.18.1.7", topology=TOPOLOGY, engine="mxnet",
                service_env={"DMLC_ROLE": role, "DMLC_NUM_WORKER": "2", "BYTEPS_CPU_ONLY": "1",
                             "LINK_BANDWIDTH": "1gbit", "BYTEPS_SCHEDULER": "fifo", "EXTRA": "x"},
                caller_env=CALLER, bin_dir="/venv/bin")
    args.update(kw)
    return role_environment(**args)


def test_worker_environment_is_a_real_clusters():
    env = env_for("worker", 2)
    assert env["DMLC_ROLE"] == "worker"
    assert env["DMLC_WORKER_ID"] == "2"
    assert env["DMLC_PS_ROOT_URI"] == "198.18.1.1" and env["DMLC_PS_ROOT_PORT"] == "9000"
    assert env["DMLC_NUM_WORKER"] == "3" and env["DMLC_NUM_SERVER"] == "2"  # the cluster's, not compose's
    assert env["DMLC_NODE_HOST"] == "198.18.1.7" and env["DMLC_INTERFACE"] == "eth0"
    assert env["BYTEPS_LOCAL_RANK"] == "0" and env["BYTEPS_LOCAL_SIZE"] == "1"
    assert env["BYTEPS_CPU_ONLY"] == "1"
    assert env["ENGINE"] == "mxnet"
    assert env["PATH"] == "/venv/bin:/usr/bin"
    assert env["EXTRA"] == "x" and env["HOME"] == "/root"
    assert env["BYTEPS_PROPHET_HOST"] == "worker-2"


def test_scheduling_knobs_pass_through_and_stale_cluster_variables_do_not():
    env = env_for("server", 1)
    assert env["BYTEPS_SCHEDULER"] == "prophet"  # the caller's wins over compose's
    assert env["PROPHET_MODE"] == "paper" and env["BYTESCHEDULER_CREDIT"] == "4"
    assert env["BYTEPS_PROPHET_ATOM_ELEMENTS"] == "250000"  # the plugin's knobs reach every role
    assert "BYTEPS_LOG_LEVEL" not in env  # other BYTEPS_* stay with the caller
    assert env["BYTEPS_PROPHET_HOST"] == "server-1"  # the cluster's, never the caller's
    assert env["DMLC_ROLE"] == "server"
    assert "DMLC_WORKER_ID" not in env
    assert "LINK_BANDWIDTH" not in env  # Docker's entrypoint shapes; locally the cluster does


def test_run_env_overrides_knobs_but_not_topology():
    env = env_for("worker", 0, run_env={"BYTEPS_SCHEDULER": "bytescheduler", "BYTEPS_LOG_LEVEL": "INFO"})
    assert env["BYTEPS_SCHEDULER"] == "bytescheduler" and env["BYTEPS_LOG_LEVEL"] == "INFO"
    with pytest.raises(ConfigError, match="DMLC_WORKER_ID is set by the cluster"):
        check_run_env({"DMLC_WORKER_ID": "3"})
    with pytest.raises(ConfigError, match="must be a string"):
        check_run_env({"X": 1})


def test_role_commands():
    assert role_command("worker", ("python", "a.py"), ["python", "b.py"]) == ("python", "b.py")
    assert role_command("worker", ("python", "a.py"), None) == ("python", "a.py")
    assert role_command("worker", None, None) == SELFTEST_COMMAND
    assert role_command("server", None, ["python", "b.py"]) == SERVE_COMMAND
    assert role_command("scheduler", ("python", "-c", "import mxnet"), ["x"]) == ("python", "-c", "import mxnet")


def test_shaping_commands():
    link = netns.Link("ns", "eth0")
    assert netns.shaping_batch(link, 10**9, 0) == [
        "qdisc replace dev eth0 root handle 1: tbf rate 1000000000bit burst 125000 latency 50ms"]
    assert netns.shaping_batch(link, 8 * 10**6, 500) == [
        "qdisc replace dev eth0 root handle 1: netem delay 500us limit 100000",
        "qdisc replace dev eth0 parent 1:1 handle 10: tbf rate 8000000bit burst 98304 latency 50ms"]
    assert netns.shaping_batch(link, None, 0) == ["qdisc del dev eth0 root"]
    # every bucket holds a whole 64 KiB GSO packet, so a rate change can never strand a queued one
    assert min(netns.tbf_burst(b) for b in (10**6, 2 * 10**8, 10**9)) > 64 * 1024
    assert netns.shaping_batch(link, None, 250) == [
        "qdisc replace dev eth0 root handle 1: netem delay 250us limit 100000"]


def test_host_addresses_are_distinct_and_in_the_benchmarking_range():
    addresses = [netns.host_address(i) for i in range(1000)]
    assert len(set(addresses)) == 1000
    for text in addresses:
        address = ipaddress.ip_address(text)
        assert address in netns.SUBNET
        assert text.split(".")[-1] not in ("0", "255")


def test_cluster_plan_from_the_compose_file():
    cluster = Cluster(ClusterSpec(workers=3, servers=2, engine="mxnet", bandwidth="200mbit"), environ={})
    assert [h.name for h in cluster.hosts] == ["scheduler", "server-0", "server-1", "worker-0", "worker-1",
                                              "worker-2"]
    assert [h.service.name for h in cluster.hosts] == ["scheduler", "server-0", "server-0", "worker-0",
                                                      "worker-1", "worker-1"]
    assert all(h.bandwidth == 200 * 10**6 and h.latency_us == 0 for h in cluster.hosts)
    defaults = Cluster(ClusterSpec(), environ={"ENGINE": "mxnet", "LINK_BANDWIDTH": "300mbit"})
    assert defaults.engine == "mxnet"
    assert (defaults.num_workers, defaults.num_servers) == (2, 1)
    assert all(h.bandwidth == 300 * 10**6 for h in defaults.hosts)
    assert "worker-1" in defaults.describe()


@pytest.mark.parametrize("spec, fragment", [
    (ClusterSpec(engine="horovod"), "engine 'horovod' is not an engine; valid: byteps, mxnet"),
    (ClusterSpec(workers=0), "--workers 0 must be an integer >= 1"),
    (ClusterSpec(servers=-1), "--servers -1 must be an integer >= 1"),
    (ClusterSpec(workers=300), "more than the 250"),
    (ClusterSpec(bandwidth="100"), "--bandwidth '100' has no unit"),
    (ClusterSpec(latency="fast"), "--latency 'fast' is not a time"),
])
def test_cluster_spec_errors(spec, fragment):
    with pytest.raises(UserError, match=fragment.replace("(", r"\(")):
        Cluster(spec, environ={})


def test_unstarted_cluster_refuses_runs_and_shaping():
    cluster = Cluster(ClusterSpec(engine="mxnet"), environ={})
    with pytest.raises(UserError, match="not started"):
        cluster.launch(["true"])
    with pytest.raises(UserError, match="not started"):
        cluster.set_bandwidth("1gbit")


def test_exit_descriptions():
    assert describe_exit("worker-1", -9) == "worker-1 was killed by SIGKILL"
    assert describe_exit("worker-1", 137) == "worker-1 was killed by SIGKILL (status 137)"
    assert describe_exit("server-0", 3) == "server-0 exited with status 3"


@pytest.mark.parametrize("argv, fragment", [
    (["cluster", "run", "--bandwidth", "100", "--dry-run"], "--bandwidth '100' has no unit"),
    (["cluster", "run", "--engine", "nccl", "--dry-run"], "valid: byteps, mxnet"),
    (["cluster", "run", "--compose", "/nonexistent.yml", "--dry-run"], "/nonexistent.yml: cannot read it"),
    (["cluster", "run", "--timeout", "0", "--dry-run"], "--timeout 0 must be a positive"),
    (["cluster", "run", "-e", "NOEQUALS", "--dry-run"], "--env 'NOEQUALS' must be KEY=VALUE"),
])
def test_cli_errors_exit_2_with_one_line(argv, fragment, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err
    assert err.count("\n") == 1 and err.startswith("byteps-prophet cluster: error:")


def test_cli_dry_run_shows_roles_and_environment(capsys):
    assert cli.main(["cluster", "run", "--engine", "mxnet", "--workers", "3", "--dry-run", "--",
                     "python", "train.py"]) == 0
    out = capsys.readouterr().out
    assert "worker-2: python train.py" in out
    assert "scheduler: python -m byteps_prophet.cluster.serve" in out
    assert "DMLC_NUM_WORKER=3" in out and "ENGINE=mxnet" in out


@pytest.mark.parametrize("netns_wanted", [None, True])
def test_no_namespaces_is_a_one_line_error_not_a_silent_loopback(monkeypatch, netns_wanted):
    """Unshaped loopback links would pass for shaped ones: without namespaces the cluster refuses,
    naming the reason and --no-netns, and leaves nothing behind."""
    monkeypatch.setattr(netns, "unavailable_reason", lambda: "network namespaces need root (test)")
    cluster = Cluster(ClusterSpec(engine="mxnet", netns=netns_wanted), environ={})
    with pytest.raises(UserError) as err:
        cluster.start()
    message = str(err.value)
    assert "network namespaces need root (test)" in message and "--no-netns" in message
    assert "\n" not in message
    assert cluster.use_netns is None and not cluster._namespaces  # nothing built, nothing to tear down


def test_a_tcp_congestion_the_kernel_has_but_keeps_from_namespaces_is_refused_before_any_is_built(monkeypatch):
    """A kernel may have CUBIC loaded but allow only reno and BBR outside the host's namespace: the
    cluster says so, with the valid choices and the sysctl that allows it, before building anything
    (setting it in a namespace would fail half-way with the kernel's 'Operation not permitted')."""
    monkeypatch.setattr(netns, "unavailable_reason", lambda: None)
    monkeypatch.setattr(netns, "available_tcp_congestion", lambda: ["reno", "bbr", "cubic"])
    monkeypatch.setattr(netns, "allowed_tcp_congestion", lambda: ["reno", "bbr"])
    cluster = Cluster(ClusterSpec(engine="mxnet", tcp_congestion="cubic"), environ={})
    with pytest.raises(UserError) as err:
        cluster.start()
    message = str(err.value)
    assert "'cubic' is not allowed in network namespaces" in message and "valid: reno, bbr" in message
    assert "net.ipv4.tcp_allowed_congestion_control='reno bbr cubic'" in message and "\n" not in message
    assert not cluster._namespaces  # nothing built, nothing to tear down


def test_no_namespaces_cli_run_exits_2_naming_no_netns(monkeypatch, capsys):
    monkeypatch.setattr(netns, "unavailable_reason", lambda: "network namespaces need root (test)")
    assert cli.main(["cluster", "run", "--engine", "mxnet", "--workers", "1", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("byteps-prophet cluster: error: cannot build a namespace")
    assert "--no-netns" in err


def test_no_netns_chooses_plain_loopback(monkeypatch):
    monkeypatch.setattr(netns, "unavailable_reason", lambda: "network namespaces need root (test)")
    with Cluster(ClusterSpec(engine="mxnet", netns=False), environ={}) as cluster:
        assert cluster.use_netns is False
        assert all(h.address == "127.0.0.1" for h in cluster.hosts)
        assert cluster.environment(cluster.hosts[0])["DMLC_INTERFACE"] == "lo"
        with pytest.raises(UserError, match="plain loopback"):
            cluster.set_bandwidth("1gbit")


def test_workers_only_cluster_gets_torch_distributed_environment():
    with Cluster(ClusterSpec(workers=3, netns=False, parameter_server=False), environ=CALLER) as cluster:
        assert [h.name for h in cluster.hosts] == ["worker-0", "worker-1", "worker-2"]
        env = cluster.environment(cluster.host("worker-2"), {"EXTRA": "1"})
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("2", "3", "0")
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == str(cluster.port)
    assert env["DMLC_WORKER_ID"] == "2" and env["DMLC_NUM_WORKER"] == "3"  # not the caller's stale 99
    assert "DMLC_ROLE" not in env  # else torch's default backend would be byteps
    assert env["BYTEPS_LOG_LEVEL"] == "DEBUG" and env["EXTRA"] == "1"  # the caller's own, as torchrun


def test_parameter_server_workers_find_worker_0s_order_channel():
    # an unmodified BytePS script under BYTEPS_SCHEDULER=prophet keeps its order channel in a store
    # worker 0 hosts (backends/byteps_ps.py): the cluster tells every worker where, once per cluster
    with Cluster(ClusterSpec(workers=2, servers=1, netns=False), environ=dict(CALLER, MASTER_ADDR="10.9.9.9")) as cluster:
        w0, w1 = (cluster.environment(cluster.host(f"worker-{i}")) for i in (0, 1))
        server = cluster.environment(cluster.host("server-0"))
        own = cluster.environment(cluster.host("worker-1"), {"MASTER_ADDR": "127.0.0.2", "MASTER_PORT": "1"})
    assert w0["MASTER_ADDR"] == w1["MASTER_ADDR"] == cluster.host("worker-0").address  # not the caller's
    assert w0["MASTER_PORT"] == w1["MASTER_PORT"] and w0["MASTER_PORT"] != str(cluster.port)
    assert (own["MASTER_ADDR"], own["MASTER_PORT"]) == ("127.0.0.2", "1")  # a run's own choice wins
    assert server.get("MASTER_ADDR") == "10.9.9.9"  # other roles: untouched


@pytest.mark.parametrize("module", ["byteps_prophet.cluster.loopback_torch", "byteps_prophet.cluster.loopback_mxnet"])
@pytest.mark.parametrize("argv, fragment", [
    (["-w", "x", "--", "true"], "invalid int value: 'x'"),
    (["--timeout", "0", "--", "true"], "timeout 0.0 must be a positive"),
    (["--"], "a worker COMMAND is required after --"),
])
def test_launcher_errors_exit_2_with_one_line(module, argv, fragment, capsys):
    import importlib

    launcher = importlib.import_module(module)
    if module.endswith("loopback_torch"):
        argv = ["-n" if a == "-w" else a for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        launcher.main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and fragment in err
    assert err.count("\n") == 1 and err.startswith(f"python -m {module}: error:")


@pytest.mark.slow
def test_torch_launcher_gives_each_worker_its_rank_and_names_a_killed_one():
    proc = subprocess.run(
        [sys.executable, "-m", "byteps_prophet.cluster.loopback_torch", "-n", "2", "--timeout", "60", "--", "sh", "-c",
         'echo "rank $RANK of $WORLD_SIZE at $MASTER_ADDR:$MASTER_PORT"; '
         'if [ "$RANK" = 1 ]; then kill -9 $$; fi; sleep 50'],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 137, proc.stderr
    assert "launch: worker-1 was killed by SIGKILL" in proc.stderr
    for rank in (0, 1):
        assert f"worker-{rank} | rank {rank} of 2 at 127.0.0.1:" in proc.stdout


@pytest.mark.parametrize("module, env, message", [
    ("byteps_prophet.cluster.serve", {"DMLC_ROLE": "server", "ENGINE": "tf"}, "serve: ENGINE='tf' is invalid; valid: byteps, mxnet"),
    ("byteps_prophet.cluster.serve", {"DMLC_ROLE": "server", "PS_ZMQ_IDLE_US": "-5"},
     "serve: PS_ZMQ_IDLE_US=-5 is invalid; valid: an integer >= 0 (microseconds; 0 = spin)"),
    ("byteps_prophet.cluster.selftest", {"SELFTEST_ROUNDS": "0"}, "selftest: SELFTEST_ROUNDS='0' is invalid; valid: an integer >= 1"),
    ("byteps_prophet.cluster.container_shaping", {"LINK_SHAPING": "maybe"}, "linkshape: error: LINK_SHAPING='maybe' is invalid; valid: 0, 1"),
    ("byteps_prophet.ab.workloads.train_entrypoint", {"TRAIN_STEPS": "ten"}, "train: TRAIN_STEPS='ten' is invalid; valid: an integer >= 1"),
    ("byteps_prophet.ab.workloads.train_entrypoint", {"BYTEPS_SCHEDULER": "lifo"}, "train: BYTEPS_SCHEDULER='lifo' is not a scheduler"),
])
def test_a_containers_bad_variable_ends_its_entrypoint_in_one_line(module, env, message):
    """Each entrypoint reads the compose file's environment through cluster/container.py (and the
    engine knobs through Settings) before it starts anything: exit 2, one line naming the variable."""
    import os

    proc = subprocess.run([sys.executable, "-m", module], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith(message) and len(proc.stderr.splitlines()) == 1, proc


def test_train_runs_the_engines_bench_with_the_compose_files_job():
    from byteps_prophet.cluster.container import container
    from byteps_prophet.ab.workloads.train_entrypoint import bench_argv

    argv = bench_argv(container({"ENGINE": "mxnet", "TRAIN_MODEL": "mlp", "TRAIN_BATCH": "8"}), ["--x"])
    assert argv[1:] == ["-m", "byteps_prophet.ab.workloads.mxnet_bench", "--backend", "kvstore", "--model", "mlp",
                        "--steps", "10", "--warmup", "3", "--batch", "8", "--x"]
