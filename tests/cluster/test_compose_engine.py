"""docker/docker-compose.yml under a real container engine (docker.io + docker-compose 1.29 from Debian).

* quick: docker-compose's own reading of the file and the netns cluster's reading agree (one topology);
* slow: scripts/compose.sh builds the base image (mmdebstrap) and the project image offline (cached
  when unchanged) and runs `up`: the self-test, then a real training job under Prophet on the shaped
  links, to the workers' success; a server killed mid-run ends `up` at once, naming it.

Without the engine (and no root or apt-get to install it) the slow tests skip, saying why.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from byteps_prophet.cluster import Cluster, ClusterSpec
from byteps_prophet.cluster.compose import load_compose
from byteps_prophet.units import parse_bandwidth

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker" / "docker-compose.yml"
SCRIPT = REPO / "scripts" / "compose.sh"
CALLER = {"ENGINE": "mxnet", "BYTEPS_SCHEDULER": "prophet", "LINK_BANDWIDTH": "200mbit", "TRAIN_STEPS": "4"}


def _compose_config(environ: dict) -> dict:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **environ}
    proc = subprocess.run([binary, "-f", str(COMPOSE), "config"], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


def test_compose_and_the_netns_cluster_read_the_same_topology():
    engine_view = _compose_config(CALLER)["services"]
    ours = load_compose(environ=CALLER)
    cluster = Cluster(ClusterSpec(), environ=CALLER)  # not started: its plan only
    services = [ours.scheduler, *ours.servers, *ours.workers]
    assert [s.name for s in services] == [name for name, body in engine_view.items()
                                          if "DMLC_ROLE" in (body.get("environment") or {})]
    for service in services:
        body = engine_view[service.name]
        environment = {k: str(v) for k, v in body["environment"].items() if v is not None}
        assert environment == service.environment, service.name
        assert tuple(body["command"]) == service.command, service.name
        assert body["hostname"] == service.name  # the agent and ps-lite address hosts by it
    # the cluster's hosts are the file's services, as many as the file's DMLC_NUM_* say
    env = ours.scheduler.environment
    assert [h.name for h in cluster.hosts] == [s.name for s in services]
    assert [h.role for h in cluster.hosts] == [s.role for s in services]
    assert len(ours.workers) == int(env["DMLC_NUM_WORKER"]) and len(ours.servers) == int(env["DMLC_NUM_SERVER"])
    assert cluster.engine == "mxnet" == env["ENGINE"]
    assert {h.bandwidth for h in cluster.hosts} == {parse_bandwidth("200mbit")}
    for worker in ours.workers:  # what the agent reads under compose
        assert worker.environment["MASTER_ADDR"] == "worker-0"
        assert worker.environment["TRAIN_COMMAND"] == "python -m byteps_prophet.ab.workloads.train_entrypoint"


# ---------------------------------------------------------------------------------------------- slow

def _run(argv, timeout, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture(scope="module")
def engine():
    """A running Docker engine: installed and started by scripts/compose.sh when missing (root, apt);
    a dockerd this fixture started is stopped again at the end."""
    if shutil.which("docker") and _run(["docker", "info"], 60).returncode == 0:
        yield None
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("no running Docker engine, and it cannot be installed here (needs root and apt-get)")
    proc = _run([str(SCRIPT), "engine"], 900)
    if proc.returncode != 0:
        pytest.skip(f"the Docker engine could not be installed or started: {proc.stderr.strip()[-300:]}")
    yield None
    pidfile = Path("/run/byteps-prophet-dockerd.pid")
    if pidfile.exists():
        subprocess.run(["kill", pidfile.read_text().strip()], check=False)


@pytest.fixture(scope="module")
def image(engine):
    start = time.monotonic()
    proc = _run([str(SCRIPT), "build"], 1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(f"image built or found cached in {time.monotonic() - start:.0f}s")


def _leftovers(project: str) -> list[str]:
    containers = _run(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}"], 60)
    networks = _run(["docker", "network", "ls", "-q", "--filter", f"label=com.docker.compose.project={project}"], 60)
    return (containers.stdout + networks.stdout).split()


@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("engine_name", ["byteps", "mxnet"])
def test_compose_up_runs_the_selftest_then_prophet_training(image, engine_name):
    project = f"bpp-test-{os.getpid()}-{engine_name}"
    env = dict(os.environ, COMPOSE_PROJECT_NAME=project, ENGINE=engine_name, LINK_BANDWIDTH="500mbit",
               TRAIN_MODEL="mlp", TRAIN_STEPS="5", TRAIN_WARMUP="2", CLUSTER_TIMEOUT="400")
    env.pop("BYTEPS_SCHEDULER", None)  # the training session defaults to prophet
    proc = _run([str(SCRIPT), "up", "--no-color"], 600, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert out.count("selftest OK") == 2, out[-4000:]
    assert "linkshape: eth0 egress: 500mbit" in out
    assert "run succeeded: 2 session(s) on 4 hosts" in out
    lines = [json.loads(line.split("|", 1)[1]) for line in out.splitlines()
             if "|" in line and line.split("|", 1)[1].strip().startswith("{")]
    results = [r for r in lines if "samples_per_s" in r]
    assert results and all(r["scheduler"] == "prophet" for r in results), out[-4000:]
    assert results[0]["samples_per_s"] > 0
    assert _leftovers(project) == []


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_server_killed_mid_run_ends_up_naming_it(image):
    project = f"bpp-test-{os.getpid()}-crash"
    env = dict(os.environ, COMPOSE_PROJECT_NAME=project, ENGINE="byteps", TRAIN_MODEL="mlp",
               TRAIN_STEPS="100000", CLUSTER_TIMEOUT="400")
    proc = subprocess.Popen([str(SCRIPT), "up", "--no-color"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if "session 0 (selftest) done" in line:
                break
        killed_at = time.monotonic()
        kill = _run(["docker", "kill", f"{project}_server-0_1"], 60)
        assert kill.returncode == 0, kill.stderr
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = "".join(seen) + rest
    assert proc.returncode != 0, out[-3000:]
    assert time.monotonic() - killed_at < 60
    assert "server-0 failed: its container ended without reporting (killed?) in session 1 (training)" in out, out[-3000:]
    assert _leftovers(project) == []
