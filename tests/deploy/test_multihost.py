"""Several hosts, plain BytePS, `byteps-prophet launch` on each (slow, root).

Every "host" is a network namespace of the local cluster's plumbing (byteps_prophet.cluster: a bridge,
one veth per host, 198.18.0.0/15 addresses), and runs its own process tree: its launcher is started by
`ip netns exec NS setsid --fork`, so no host shares a parent with another or with the test. The
scheduler is reached by its IP address only. Checked: the job trains to the single-process reference;
a killed host and a host whose link goes down each end the job on every other host within 30 s, naming
that host; nothing is left (processes, namespaces, /dev/shm, BytePS socket directories).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from byteps_prophet.cluster import netns
from byteps_prophet.deploy.role import SOCKET_DIR_PREFIX, clean_stale_socket_dirs
from hosts import LAUNCH, Hosts

TRAIN = str(Path(__file__).with_name("bps_train.py"))


def _reason() -> str | None:
    try:
        reason = netns.unavailable_reason()
    except Exception as err:  # noqa: BLE001 - any failure means: skip
        return str(err)
    if reason:
        return reason
    probe = subprocess.run([sys.executable, "-c", "import byteps.torch"], capture_output=True, timeout=120)
    return None if probe.returncode == 0 else "byteps is not built (scripts/build_byteps.sh)"


_REASON = _reason()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_REASON is not None, reason=f"needs root, namespaces and "
                                                                               f"BytePS: {_REASON}")]


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm"))


def _socket_dirs() -> set[str]:
    return {e for e in os.listdir(tempfile.gettempdir()) if e.startswith(SOCKET_DIR_PREFIX)}


@pytest.fixture
def network():
    """The hosts' namespaces and links, nothing running in them; removed in the end."""
    from byteps_prophet.cluster.local import Cluster, ClusterSpec

    shm_before, sockets_before = _shm(), _socket_dirs()
    cluster = Cluster(ClusterSpec(workers=2, servers=1, bandwidth="1gbit", engine="byteps"), output=False)
    cluster.start()
    try:
        yield cluster
    finally:
        names = [h.netns for h in cluster.hosts]
        cluster.close()
    assert not set(names) & set(netns.list_namespaces())
    assert _shm() <= shm_before, _shm() - shm_before
    clean_stale_socket_dirs()  # a killed launcher's directory: what the next launch on that host removes
    assert _socket_dirs() <= sockets_before


def _start_job(network, hosts: Hosts, out: str, steps: int, pause: float, schedule: str) -> None:
    scheduler = network.host("scheduler")
    common = ["--scheduler-addr", scheduler.address, "--workers", "2", "--servers", "1",
              "--byteps-scheduler", schedule, "--connect-timeout", "60", "--heartbeat-timeout", "8"]
    # every host on its own, in no particular order: the scheduler host last
    for host in reversed(network.hosts):
        argv = LAUNCH + ["--role", host.role] + common
        if host.role == "worker":
            argv += ["--worker-id", str(host.index), "--", sys.executable, TRAIN, out, str(steps), str(pause)]
        hosts.start_detached(host.name, host.netns, argv)


def _all_gone(network) -> bool:
    return all(not netns.netns_pids(h.netns) for h in network.hosts)


def test_four_hosts_train_to_the_reference(network, tmp_path):
    import torch

    hosts = Hosts(str(tmp_path))
    out = str(tmp_path / "params")
    _start_job(network, hosts, out, steps=6, pause=0.0, schedule="prophet")
    codes = hosts.wait(180)
    assert codes == {"scheduler": 0, "server-0": 0, "worker-0": 0, "worker-1": 0}, hosts.report()
    for name in codes:
        assert hosts.hosts[name].last_line().endswith("all 2 workers succeeded; job ended (exit 0)"), hosts.report()
    scheduler_log = hosts.hosts["scheduler"].output()
    for name in ("server-0", "worker-0", "worker-1"):  # each came from its own address
        assert f"{name} connected from {network.host(name).address}" in scheduler_log
    assert _all_gone(network)
    subprocess.run([sys.executable, TRAIN, "--reference", "2", str(tmp_path / "ref.pt"), "6"], check=True, timeout=120)
    reference = torch.load(tmp_path / "ref.pt")
    for rank in (0, 1):
        params = torch.load(f"{out}.rank{rank}.pt")
        for key in reference:
            torch.testing.assert_close(params[key], reference[key], rtol=0, atol=1e-6, msg=f"rank {rank} {key}")


def _wait_training(hosts: Hosts, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "rank 0 step 3" in hosts.hosts["worker-0"].output():
            return
        if any(h.poll() is not None for h in hosts.hosts.values()):
            break
        time.sleep(0.1)
    pytest.fail("the job never got to training\n" + hosts.report())


def test_a_killed_host_ends_the_job_on_every_host_naming_it(network, tmp_path):
    hosts = Hosts(str(tmp_path))
    _start_job(network, hosts, str(tmp_path / "params"), steps=100000, pause=0.05, schedule="fifo")
    _wait_training(hosts)
    victim = network.host("worker-1")
    killed_at = time.monotonic()
    for pid in netns.netns_pids(victim.netns):  # the whole host: its launcher, BytePS worker, shell
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    others = ["scheduler", "server-0", "worker-0"]
    codes = hosts.wait(60, others)
    assert codes == {name: 1 for name in others}, hosts.report()
    for name in others:
        ended = hosts.hosts[name].ended_at - killed_at
        print(f"{name} ended {ended:.1f}s after worker-1's host was killed")
        assert ended < 30, f"{name} ended {ended:.1f}s after the kill\n" + hosts.report()
        assert f"worker-1 ({victim.address}) lost: its launcher's connection closed" in hosts.hosts[name].last_line()
    deadline = time.monotonic() + 10
    while not _all_gone(network) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _all_gone(network), {h.name: netns.netns_pids(h.netns) for h in network.hosts}


def test_a_host_whose_link_goes_down_is_lost_within_30s(network, tmp_path):
    hosts = Hosts(str(tmp_path))
    _start_job(network, hosts, str(tmp_path / "params"), steps=100000, pause=0.05, schedule="prophet")
    _wait_training(hosts)
    victim = network.host("server-0")
    netns.ip_batch([f"link set {netns.HOST_DEV} down"], ns=victim.netns)  # no FIN, no RST: silence
    cut_at = time.monotonic()
    codes = hosts.wait(60)
    assert codes == {"scheduler": 1, "server-0": 1, "worker-0": 1, "worker-1": 1}, hosts.report()
    for name in ("scheduler", "worker-0", "worker-1"):
        ended = hosts.hosts[name].ended_at - cut_at
        print(f"{name} ended {ended:.1f}s after server-0's link went down")
        assert ended < 30, f"{name} ended {ended:.1f}s after the cut\n" + hosts.report()
        assert f"server-0 ({victim.address}) lost: no word from its launcher for 8s" in hosts.hosts[name].last_line()
    # the cut-off host hears nothing either, and ends naming the scheduler
    assert "scheduler lost: no word from the scheduler host" in hosts.hosts["server-0"].last_line()
    assert _all_gone(network)
