"""`byteps-prophet launch` on loopback with real processes (quick): every host is its own launcher
process; the roles are small shell commands, so the supervision is what is tested (the namespace test
runs real BytePS)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from byteps_prophet.deploy import launch
from byteps_prophet.deploy.role import Role, clean_stale_socket_dirs
from byteps_prophet.errors import ConfigError
from hosts import LAUNCH, Hosts, free_port_pair


def _job(tmp_path, roles: dict[str, list[str]], workers=2, servers=1, extra=()):
    """Start scheduler, servers and workers of one job on 127.0.0.1; ``roles`` gives each host's command."""
    port = free_port_pair()
    hosts = Hosts(str(tmp_path))
    common = ["--scheduler-addr", "127.0.0.1", "--scheduler-port", str(port), "--workers", str(workers),
              "--servers", str(servers), "--heartbeat-timeout", "3", "--grace", "2", "--connect-timeout", "30",
              *extra]
    for name, command in roles.items():
        role = name.split("-")[0]
        argv = LAUNCH + ["--role", role] + common
        if role == "worker":
            argv += ["--worker-id", name.split("-")[1]]
        hosts.start(name, argv + ["--"] + command)
    return hosts


def _sh(script: str) -> list[str]:
    return ["sh", "-c", script]


def test_success_every_host_exits_0_and_workers_learn_worker0(tmp_path):
    show = 'echo "env $DMLC_ROLE $DMLC_WORKER_ID $DMLC_NUM_WORKER $DMLC_PS_ROOT_URI $MASTER_ADDR:$MASTER_PORT"'
    hosts = _job(tmp_path, {"scheduler": _sh("sleep 1"), "server-0": _sh("sleep 1"),
                            "worker-0": _sh(f"{show}; sleep 0.5"), "worker-1": _sh(f"{show}; sleep 0.5")})
    try:
        codes = hosts.wait(60)
    finally:
        hosts.kill_all()
    assert codes == {"scheduler": 0, "server-0": 0, "worker-0": 0, "worker-1": 0}, hosts.report()
    for name in ("worker-0", "worker-1"):
        assert f"env worker {name[-1]} 2 127.0.0.1 127.0.0.1:29512" in hosts.hosts[name].output()
        assert hosts.hosts[name].last_line().endswith("all 2 workers succeeded; job ended (exit 0)")


def test_a_failed_worker_ends_every_host_naming_it(tmp_path):
    hosts = _job(tmp_path, {"scheduler": ["sleep", "60"], "server-0": ["sleep", "60"],
                            "worker-0": ["sleep", "60"], "worker-1": _sh("sleep 1; exit 3")})
    try:
        started = time.monotonic()
        codes = hosts.wait(30)
        took = time.monotonic() - started
    finally:
        hosts.kill_all()
    assert codes == {"scheduler": 3, "server-0": 3, "worker-0": 3, "worker-1": 3}, hosts.report()
    assert took < 15, hosts.report()
    for name in ("scheduler", "server-0", "worker-0"):
        assert "worker-1 (127.0.0.1) failed: exit status 3" in hosts.hosts[name].last_line(), hosts.report()
    assert hosts.hosts["worker-1"].last_line() == "launch: worker-1 failed: exit status 3; job ended (exit 3)"


def test_a_silent_host_is_lost_after_the_heartbeat_timeout(tmp_path):
    hosts = _job(tmp_path, {"scheduler": ["sleep", "60"], "server-0": ["sleep", "60"],
                            "worker-0": ["sleep", "60"], "worker-1": ["sleep", "60"]})
    frozen = hosts.hosts["server-0"].proc
    try:
        deadline = time.monotonic() + 30
        while "job started" not in hosts.hosts["scheduler"].output() and time.monotonic() < deadline:
            time.sleep(0.1)
        os.killpg(frozen.pid, signal.SIGSTOP)  # the launcher and its role freeze: a host that went silent
        stopped_at = time.monotonic()
        codes = hosts.wait(30, ["scheduler", "worker-0", "worker-1"])
        took = max(h.ended_at for n, h in hosts.hosts.items() if n != "server-0") - stopped_at
    finally:
        os.killpg(frozen.pid, signal.SIGCONT)
        hosts.kill_all()
    assert codes == {"scheduler": 1, "worker-0": 1, "worker-1": 1}, hosts.report()
    assert 2.5 < took < 10, hosts.report()
    for name in ("scheduler", "worker-0", "worker-1"):
        assert "server-0 (127.0.0.1) lost: no word from its launcher for 3s" in hosts.hosts[name].last_line()


def test_the_scheduler_host_going_ends_the_others_naming_it(tmp_path):
    hosts = _job(tmp_path, {"scheduler": ["sleep", "60"], "server-0": ["sleep", "60"],
                            "worker-0": ["sleep", "60"]}, workers=1)
    try:
        deadline = time.monotonic() + 30
        while "job started" not in hosts.hosts["scheduler"].output() and time.monotonic() < deadline:
            time.sleep(0.1)
        os.killpg(hosts.hosts["scheduler"].proc.pid, signal.SIGKILL)
        codes = hosts.wait(20, ["server-0", "worker-0"])
    finally:
        hosts.kill_all()
    assert codes == {"server-0": 1, "worker-0": 1}, hosts.report()
    for name in ("server-0", "worker-0"):
        assert "scheduler lost: the scheduler host 127.0.0.1:" in hosts.hosts[name].last_line()


def test_hosts_that_disagree_on_the_topology_are_refused(tmp_path):
    port = free_port_pair()
    hosts = Hosts(str(tmp_path))
    common = ["--scheduler-addr", "127.0.0.1", "--scheduler-port", str(port), "--servers", "1",
              "--connect-timeout", "20"]
    hosts.start("scheduler", LAUNCH + ["--role", "scheduler", "--workers", "2"] + common + ["--", "sleep", "60"])
    hosts.start("worker-0", LAUNCH + ["--role", "worker", "--workers", "3", "--worker-id", "0"] + common
                + ["--", "sleep", "60"])
    try:
        codes = hosts.wait(20)
    finally:
        hosts.kill_all()
    assert codes == {"scheduler": 2, "worker-0": 2}, hosts.report()
    assert "was launched with workers 3, the scheduler with 2" in hosts.hosts["scheduler"].last_line()


def test_the_same_worker_id_twice_is_refused(tmp_path):
    port = free_port_pair()
    hosts = Hosts(str(tmp_path))
    common = ["--scheduler-addr", "127.0.0.1", "--scheduler-port", str(port), "--servers", "1",
              "--workers", "2", "--connect-timeout", "20"]
    hosts.start("scheduler", LAUNCH + ["--role", "scheduler"] + common + ["--", "sleep", "60"])
    hosts.start("a", LAUNCH + ["--role", "worker", "--worker-id", "1"] + common + ["--", "sleep", "60"])
    time.sleep(1.0)
    hosts.start("b", LAUNCH + ["--role", "worker", "--worker-id", "1"] + common + ["--", "sleep", "60"])
    try:
        codes = hosts.wait(20)
    finally:
        hosts.kill_all()
    assert codes["scheduler"] == 2, hosts.report()
    assert "worker-1 was launched twice" in hosts.hosts["scheduler"].last_line()


# ------------------------------------------------------------------------------ bad input, dry run
def _cli(*argv, env=None):
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_", "ENGINE"))}
    environ.update(env or {})
    return subprocess.run(LAUNCH + list(argv), capture_output=True, text=True, timeout=60, env=environ)


@pytest.mark.parametrize("argv, culprit", [
    ((), "no role: pass --role or set DMLC_ROLE; valid: scheduler, server, worker"),
    (("--role", "master"), "--role/DMLC_ROLE 'master' is not a role; valid: scheduler, server, worker"),
    (("--role", "worker"), "no scheduler address: pass --scheduler-addr or set DMLC_PS_ROOT_URI"),
    (("--role", "worker", "--scheduler-addr", "10.0.0.1", "--servers", "1"), "no number of workers"),
    (("--role", "worker", "--scheduler-addr", "10.0.0.1", "--servers", "1", "--workers", "2"), "no worker id"),
    (("--role", "worker", "--scheduler-addr", "10.0.0.1", "--servers", "1", "--workers", "2", "--worker-id", "2"),
     "--worker-id/DMLC_WORKER_ID '2' is invalid; valid: an integer 0-1"),
    (("--role", "worker", "--scheduler-addr", "10.0.0.1", "--servers", "1", "--workers", "1"),
     "a worker needs its COMMAND after --"),
    (("--role", "server", "--scheduler-addr", "10.0.0.1", "--servers", "1", "--workers", "1",
      "--scheduler-port", "70000"), "--scheduler-port/DMLC_PS_ROOT_PORT '70000' is invalid; valid: an integer 1-65535"),
    (("--role", "server", "--scheduler-addr", "10.0.0.1", "--servers", "1", "--workers", "1",
      "--byteps-scheduler", "lifo"), "'lifo' is not a scheduler; valid: fifo, bytescheduler, prophet"),
    (("--role", "server", "--scheduler-addr", "10.0.0.1", "--servers", "1", "--workers", "1",
      "--engine", "tf"), "--engine/ENGINE 'tf' is not an engine; valid: byteps, mxnet"),
    (("--role", "server", "--scheduler-addr", "10.0.0.1", "--servers", "1", "--workers", "1",
      "--heartbeat-timeout", "0"), "--heartbeat-timeout '0' is invalid; valid: a positive number of seconds"),
    (("--cluster", "x.yaml"), "--cluster and --host go together"),
])
def test_bad_input_is_one_line_naming_it_exit_2(argv, culprit):
    proc = _cli(*argv)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and culprit in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_options_fall_back_on_the_dmlc_variables():
    env = {"DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9300",
           "DMLC_NUM_WORKER": "3", "DMLC_NUM_SERVER": "2", "DMLC_WORKER_ID": "2", "BYTEPS_SCHEDULER": "bytescheduler",
           "BYTEPS_LOG_LEVEL": "INFO"}
    proc = _cli("--dry-run", "--", "python", "train.py", env=env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.splitlines()[0] == "worker-2: python train.py"
    assert "connects to 127.0.0.1:9301" in out
    for line in ("DMLC_ROLE=worker", "DMLC_PS_ROOT_URI=127.0.0.1", "DMLC_PS_ROOT_PORT=9300", "DMLC_NUM_WORKER=3",
                 "DMLC_NUM_SERVER=2", "DMLC_WORKER_ID=2", "DMLC_NODE_HOST=127.0.0.1", "DMLC_INTERFACE=lo",
                 "BYTEPS_SCHEDULER=bytescheduler", "BYTEPS_LOG_LEVEL=INFO", "ENGINE=byteps"):
        assert f"    {line}" in out.splitlines(), out
    # an option beats its variable
    proc = _cli("--dry-run", "--worker-id", "0", "--byteps-scheduler", "prophet", "--", "x", env=env)
    assert "    DMLC_WORKER_ID=0" in proc.stdout.splitlines() and "    BYTEPS_SCHEDULER=prophet" in proc.stdout


def test_the_scheduler_binds_its_own_address_and_gets_no_worker_id():
    spec = launch.build_spec(role="scheduler", scheduler_addr="localhost", workers=2, servers=1, environ={})
    env = Role(spec, {"PATH": "/usr/bin"}).environment("127.0.0.1")
    assert env["DMLC_PS_ROOT_URI"] == "127.0.0.1" and env["DMLC_ROLE"] == "scheduler"
    assert "DMLC_WORKER_ID" not in env and "BYTEPS_CPU_ONLY" not in env
    assert env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
    worker = launch.build_spec(role="worker", scheduler_addr="bpp-scheduler", workers=2, servers=1, worker_id=1,
                               command=["x"], environ={"BYTEPS_CPU_ONLY": "0", "DMLC_NODE_HOST": "10.1.1.1"})
    env = Role(worker, {"BYTEPS_CPU_ONLY": "0"}).environment("10.1.1.1", {"MASTER_ADDR": "10.1.1.0"})
    assert env["DMLC_PS_ROOT_URI"] == "bpp-scheduler" and env["DMLC_WORKER_ID"] == "1"
    assert env["BYTEPS_CPU_ONLY"] == "0" and env["MASTER_ADDR"] == "10.1.1.0" and env["DMLC_NODE_HOST"] == "10.1.1.1"


def test_topology_keys_cannot_come_through_env():
    with pytest.raises(ConfigError, match="-e DMLC_WORKER_ID is set by the launcher"):
        launch.build_spec(role="server", scheduler_addr="a", workers=1, servers=1, env={"DMLC_WORKER_ID": "0"},
                          environ={})


def test_stale_socket_dirs_of_dead_launchers_are_removed(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / f"bpp-launch-{dead.pid}-abc").mkdir()
    (tmp_path / f"bpp-launch-{os.getppid()}-live").mkdir()
    assert clean_stale_socket_dirs(str(tmp_path)) == [f"bpp-launch-{dead.pid}-abc"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"bpp-launch-{os.getppid()}-live"]


def test_a_stranger_on_the_control_port_does_not_disturb_the_job(tmp_path):
    port = free_port_pair()
    hosts = Hosts(str(tmp_path))
    common = ["--scheduler-addr", "127.0.0.1", "--scheduler-port", str(port), "--servers", "1", "--workers", "1",
              "--connect-timeout", "20", "--grace", "2"]
    hosts.start("scheduler", LAUNCH + ["--role", "scheduler"] + common + ["--", "sleep", "4"])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # a port scanner, a health check: garbage, then gone
        try:
            with socket.create_connection(("127.0.0.1", port + 1), timeout=1) as stranger:
                stranger.sendall(b"GET / HTTP/1.0\r\n\r\n")
            break
        except OSError:
            time.sleep(0.1)
    hosts.start("server-0", LAUNCH + ["--role", "server"] + common + ["--", "sleep", "4"])
    hosts.start("worker-0", LAUNCH + ["--role", "worker"] + common + ["--", "sleep", "4"])
    try:
        deadline = time.monotonic() + 30
        while "job started" not in hosts.hosts["scheduler"].output() and time.monotonic() < deadline:
            time.sleep(0.1)
        late = hosts.start("late", LAUNCH + ["--role", "worker"] + common + ["--", "sleep", "1"])
        codes = hosts.wait(30)
    finally:
        hosts.kill_all()
    assert codes == {"scheduler": 0, "server-0": 0, "worker-0": 0, "late": 2}, hosts.report()
    assert "the job had already started without it" in late.last_line()
