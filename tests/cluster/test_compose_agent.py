"""The container agent (byteps_prophet.cluster.agent) on loopback: four agents as four hosts.

What compose cannot do by itself: end the whole run when one role fails, name it, and carry the run's
status out of worker-0. Each agent here is a real process supervising a real child, as in a container;
the roles' commands are small shell programs so that a test can make any role fail at any time.
"""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

HOSTS = ("scheduler", "server-0", "worker-0", "worker-1")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(commands: dict, train: str = "", extra: dict | None = None, logs=None) -> dict:
    """One agent per host; output goes to files (a role outliving a SIGKILLed agent keeps no pipe open)."""
    port = _port()
    procs = {}
    # the coordinator last, as compose starts it (depends_on): the others must wait for it
    for name in ("scheduler", "server-0", "worker-1", "worker-0"):
        role = name.split("-")[0]
        env = dict(os.environ, CLUSTER_HOST=name, CLUSTER_COORDINATOR_ADDRESS="127.0.0.1",
                   CLUSTER_AGENT_PORT=str(port), DMLC_ROLE=role, DMLC_NUM_WORKER="2", DMLC_NUM_SERVER="1",
                   CLUSTER_GRACE="2", CLUSTER_CONNECT_TIMEOUT="20", TRAIN_COMMAND=train, **(extra or {}))
        log = open(logs / f"{name}.log", "w+")
        procs[name] = subprocess.Popen([sys.executable, "-m", "byteps_prophet.cluster.agent",
                                        "sh", "-c", commands[name]],
                                       env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        procs[name].log = log
        if name == "worker-1":
            time.sleep(0.5)
    return procs


def _finish(procs: dict, within: float) -> dict:
    deadline = time.monotonic() + within
    out = {}
    try:
        for name, proc in procs.items():
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            proc.log.seek(0)
            out[name] = (proc.returncode, proc.log.read())
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return out


def test_two_sessions_succeed_and_every_agent_exits_0(tmp_path):
    # selftest-like session 0 (servers outlive the workers a little, as ps-lite's do), then training
    commands = {"scheduler": "sleep 0.4; echo ran-$DMLC_ROLE", "server-0": "sleep 0.4; echo ran-$DMLC_ROLE",
                "worker-0": "sleep 0.2; echo selftest-$CLUSTER_HOST", "worker-1": "echo selftest-$CLUSTER_HOST"}
    out = _finish(_start(commands, train="sh -c 'echo train-$CLUSTER_HOST'", logs=tmp_path), within=30)
    assert {name: code for name, (code, _) in out.items()} == dict.fromkeys(HOSTS, 0), out
    coordinator = out["worker-0"][1]
    assert "session 0 (selftest) done" in coordinator and "session 1 (training) done" in coordinator
    assert "run succeeded: 2 session(s) on 4 hosts" in coordinator
    assert out["worker-1"][1].count("selftest-worker-1") == 1 and "train-worker-1" in out["worker-1"][1]
    assert out["scheduler"][1].count("ran-scheduler") == 2  # a fresh scheduler for each session


def test_a_crashed_server_ends_the_run_at_once_and_is_named(tmp_path):
    commands = {"scheduler": "sleep 60", "server-0": "sleep 1; exit 3",
                "worker-0": "sleep 60", "worker-1": "sleep 60"}
    start = time.monotonic()
    out = _finish(_start(commands, train="true", logs=tmp_path), within=30)
    assert time.monotonic() - start < 20
    code, text = out["worker-0"]
    assert code == 3, text
    assert "server-0 failed: exit status 3 in session 0 (selftest); run ended (exit 3)" in text
    assert out["server-0"][0] == 3  # the failing container ends with its role's status
    assert out["scheduler"][0] == 0 and out["worker-1"][0] == 0  # told the run is over


def test_a_vanished_container_is_named(tmp_path):
    procs = _start({"scheduler": "sleep 60", "server-0": "sleep 60", "worker-0": "sleep 60",
                    "worker-1": f"echo $$ > {tmp_path}/role.pid; exec sleep 60"}, logs=tmp_path)
    time.sleep(2.5)
    procs["worker-1"].kill()  # as `docker kill`: no report (its role goes with the container there)
    os.kill(int((tmp_path / "role.pid").read_text()), signal.SIGKILL)
    out = _finish(procs, within=20)
    code, text = out["worker-0"]
    assert code == 1 and "worker-1 failed: its container ended without reporting" in text, text


def test_a_scheduler_that_ends_while_workers_run_fails_the_run_after_the_grace(tmp_path):
    out = _finish(_start({"scheduler": "true", "server-0": "sleep 60", "worker-0": "sleep 60",
                          "worker-1": "sleep 60"}, logs=tmp_path), within=30)
    code, text = out["worker-0"]
    assert code == 1 and "scheduler ended while workers still run in session 0" in text, text


def test_the_coordinators_own_failure_and_sigterm(tmp_path):
    out = _finish(_start({"scheduler": "sleep 60", "server-0": "sleep 60", "worker-0": "exit 7",
                          "worker-1": "sleep 60"}, logs=tmp_path), within=30)
    assert out["worker-0"][0] == 7 and "worker-0 failed: exit status 7" in out["worker-0"][1]
    assert all(out[name][0] == 0 for name in ("scheduler", "server-0", "worker-1")), out
    (tmp_path / "again").mkdir()
    procs = _start({"scheduler": "sleep 60", "server-0": "sleep 60", "worker-0": "sleep 60",
                    "worker-1": "sleep 60"}, logs=tmp_path / "again")
    time.sleep(2.5)
    procs["worker-0"].send_signal(signal.SIGTERM)  # docker stop
    out = _finish(procs, within=20)
    assert out["worker-0"][0] == 143 and "stopped from outside" in out["worker-0"][1]
    assert out["server-0"][0] == 1 and "lost the coordinator" in out["server-0"][1]


@pytest.mark.parametrize("env, fragment", [
    ({"DMLC_ROLE": "boss"}, "DMLC_ROLE='boss' is not a role; valid: scheduler, server, worker"),
    ({"DMLC_ROLE": "worker", "CLUSTER_GRACE": "soon"}, "CLUSTER_GRACE='soon' is invalid; valid: a positive number of seconds"),
])
def test_bad_settings_are_one_line_and_exit_2(env, fragment):
    proc = subprocess.run([sys.executable, "-m", "byteps_prophet.cluster.agent", "true"],
                          env=dict(os.environ, **env), capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and fragment in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_a_sigterm_after_the_run_succeeded_keeps_its_status(tmp_path):
    """Compose stops worker-0's container as soon as another container of a finished run exits: the
    run's status (0) must survive that SIGTERM, however late in the agent's exit it comes."""
    procs = _start({"scheduler": "sleep 60", "server-0": "sleep 60", "worker-0": "true", "worker-1": "true"},
                   train="true", logs=tmp_path)
    deadline = time.monotonic() + 30
    while not any(p.poll() is not None for name, p in procs.items() if name != "worker-0"):
        assert time.monotonic() < deadline, "no host ended"
        time.sleep(0.001)
    if procs["worker-0"].poll() is None:
        procs["worker-0"].send_signal(signal.SIGTERM)
    out = _finish(procs, within=20)
    assert out["worker-0"][0] == 0, out["worker-0"]


def test_a_decided_run_ignores_sigterm_while_the_agent_exits(monkeypatch):
    from byteps_prophet.cluster import agent

    monkeypatch.setattr(agent.Agent, "__init__", lambda self, argv: setattr(self, "role_name", "worker"))
    monkeypatch.setattr(agent.Agent, "run", lambda self: 0)
    before = signal.getsignal(signal.SIGTERM)
    try:
        assert agent.main(["true"]) == 0
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)
