"""Network namespaces, veth links, a bridge and tc shaping: the plumbing of the local cluster.

Layout (nothing is created in the root namespace)::

    netns <prefix>-sw          bridge br0, one veth end per host (named after the host: worker-0 ...)
    netns <prefix>-<host>      eth0 (other veth end) with 198.18.x.y/15, lo

Each link is shaped in both directions on the egress of its two veth ends: the host's ``eth0``
(upload) and the switch-side end (download). Shaping is a tbf at the given rate; with a latency, a
netem root adds half of it on each end, so a packet from one host to another is delayed by the whole
latency (one way; the round trip gets twice that).

Namespace names carry the controller's pid (``bpp-<pid>-<seq>``), so namespaces left by a controller
that was SIGKILLed can be recognised and removed (:func:`clean_stale`).
"""
from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

from byteps_prophet.errors import UserError

PREFIX = "bpp"
SUBNET = ipaddress.ip_network("198.18.0.0/15")  # RFC 2544 benchmarking range
BRIDGE = "br0"
HOST_DEV = "eth0"
TBF_LATENCY = "50ms"   # tbf queue: how long a packet may wait before it is dropped
NETEM_LIMIT = 100000   # packets netem may hold (its default of 1000 drops at high rates x delay)


class NetnsError(UserError):
    """A namespace, link or qdisc operation failed."""


@dataclass(frozen=True)
class Link:
    """One shaped direction: the egress of ``dev`` inside namespace ``ns``."""

    ns: str
    dev: str


def host_address(index: int) -> str:
    """The address of host number ``index`` (0 = scheduler) inside the benchmarking range."""
    if not 0 <= index < 60000:
        raise UserError(f"host index {index} out of range (at most 60000 hosts)")
    return str(SUBNET.network_address + 256 + index + 1 + (index // 250) * 6)


def tbf_burst(bits: int) -> int:
    """Bucket size in bytes: one millisecond at the rate, at least 96 KiB.

    The floor must exceed the largest GSO packet (64 KiB): tbf only splits packets larger than the
    bucket when they are queued, so after a rate change to a smaller bucket a packet queued under the
    old one that no longer fits stalls the link for good (seen: a 1gbit -> 200mbit change with a
    32 KiB bucket froze a gloo run with 157 packets queued)."""
    return max(96 * 1024, bits // 8 // 1000)


def shaping_batch(link: Link, bits: int | None, delay_us: int) -> list[str]:
    """tc batch lines (for ``tc -n NS -b -``) that put ``link`` into the wanted state.

    ``replace`` both creates and changes in place, so the same lines serve start-up and a change
    during a run (a tbf rate change keeps the queue and the connections).
    """
    dev = link.dev
    tbf = f"tbf rate {bits}bit burst {tbf_burst(bits)} latency {TBF_LATENCY}" if bits else None
    if delay_us > 0:
        lines = [f"qdisc replace dev {dev} root handle 1: netem delay {delay_us}us limit {NETEM_LIMIT}"]
        if tbf:
            lines.append(f"qdisc replace dev {dev} parent 1:1 handle 10: {tbf}")
        return lines
    if tbf:
        return [f"qdisc replace dev {dev} root handle 1: {tbf}"]
    return [f"qdisc del dev {dev} root"]


def _run(args: list[str], stdin: str | None = None, check: bool = True, timeout: float = 20.0):
    try:
        proc = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise NetnsError(f"{args[0]}: command not found; install iproute2 (ip, tc) or use --no-netns") from None
    except subprocess.TimeoutExpired:
        raise NetnsError(f"{' '.join(args[:4])}: timed out after {timeout:.0f}s") from None
    if check and proc.returncode != 0:
        detail = [line.strip() for line in (proc.stderr or proc.stdout).strip().splitlines() if line.strip()]
        text = " / ".join(detail[-3:]) if detail else f"exit {proc.returncode}"
        if "qdisc kind is unknown" in text and stdin and "netem" in stdin:
            text += " (the kernel lacks netem: CONFIG_NET_SCH_NETEM; use a latency of 0)"
        raise NetnsError(f"{' '.join(args)}: {text}")
    return proc


def ip_batch(lines: list[str], ns: str | None = None, force: bool = False, check: bool = True):
    """Run ``ip [-n NS] [-force] -b -`` on the given lines (one fork for many operations)."""
    if not lines:
        return None
    args = ["ip"] + (["-n", ns] if ns else []) + (["-force"] if force else []) + ["-b", "-"]
    return _run(args, "\n".join(lines) + "\n", check=check)


def tc_batch(lines: list[str], ns: str | None, check: bool = True):
    """Run ``tc [-n NS] -b -`` on the given lines (ns None: this process's namespace)."""
    if not lines:
        return None
    return _run(["tc"] + (["-n", ns] if ns else []) + ["-b", "-"], "\n".join(lines) + "\n", check=check)


def unavailable_reason() -> str | None:
    """Why namespaces cannot be used here, or None when they can (creates and removes a probe)."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces and tc need root (this process is not root)"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (package iproute2 / util-linux)"
    probe = f"{PREFIX}-{os.getpid()}-probe"
    proc = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if proc.returncode != 0:
        return f"'ip netns add' failed: {proc.stderr.strip() or proc.returncode}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


TCP_CONGESTION = "/proc/sys/net/ipv4/tcp_congestion_control"
TCP_CONGESTION_AVAILABLE = "/proc/sys/net/ipv4/tcp_available_congestion_control"
TCP_CONGESTION_ALLOWED = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"


def available_tcp_congestion() -> list[str]:
    """The TCP congestion controls this kernel has loaded (what a namespace may be given)."""
    with open(TCP_CONGESTION_AVAILABLE) as f:
        return f.read().split()


def allowed_tcp_congestion() -> list[str]:
    """The TCP congestion controls a namespace other than the host's may be given (the kernel refuses
    the others there, even to root)."""
    with open(TCP_CONGESTION_ALLOWED) as f:
        return f.read().split()


def tcp_congestion(ns: str | None) -> str:
    """The TCP congestion control new connections in ``ns`` use (None: this process's namespace). A
    new namespace starts with the host's, which is the kernel's default or the one set on the host."""
    if ns is None:
        with open(TCP_CONGESTION) as f:
            return f.read().strip()
    return _run(["ip", "netns", "exec", ns, "cat", TCP_CONGESTION]).stdout.strip()


def set_tcp_congestion(ns: str, algorithm: str) -> None:
    _run(["ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv4.tcp_congestion_control={algorithm}"])


def list_namespaces() -> list[str]:
    proc = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def netns_pids(ns: str) -> list[int]:
    proc = _run(["ip", "netns", "pids", ns], check=False)
    return [int(tok) for tok in proc.stdout.split() if tok.isdigit()]


def kill_namespace_processes(ns: str, grace: float = 1.0) -> list[int]:
    """SIGKILL whatever still runs in ``ns`` (a last resort; roles are stopped before this)."""
    pids = netns_pids(ns)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline and netns_pids(ns):
        time.sleep(0.02)
    return pids


def delete_namespaces(names: list[str]) -> list[str]:
    """Kill their processes and delete them; returns the names that could not be deleted."""
    for ns in names:
        kill_namespace_processes(ns)
    ip_batch([f"netns del {ns}" for ns in names], force=True, check=False)
    present = set(list_namespaces())
    return [ns for ns in names if ns in present]


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed but not yet reaped by its parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def clean_stale(include_live: bool = False) -> list[str]:
    """Remove ``bpp-<pid>-...`` namespaces whose controlling process is gone; returns their names."""
    stale = []
    for ns in list_namespaces():
        parts = ns.split("-")
        if len(parts) < 3 or parts[0] != PREFIX or not parts[1].isdigit():
            continue
        pid = int(parts[1])
        if include_live or (pid != os.getpid() and not process_alive(pid)):
            stale.append(ns)
    # hosts first, switch last (deleting a host removes its veth pair from the bridge)
    stale.sort(key=lambda name: name.endswith("-sw"))
    delete_namespaces(stale)
    return stale


def netem_available(ns: str) -> bool:
    """Whether the kernel has the netem qdisc (probed on a throw-away veth inside ``ns``)."""
    ip_batch(["link add bpp-nq0 type veth peer name bpp-nq1"], ns=ns)
    try:
        proc = tc_batch(["qdisc add dev bpp-nq0 root netem delay 1us"], ns, check=False)
        return proc.returncode == 0
    finally:
        ip_batch(["link del bpp-nq0"], ns=ns, check=False)


# ---------------------------------------------------------------------------------------- counters
# What a link and a host's TCP did during a run: qdisc drops show where a shaped queue overflowed,
# TCP retransmissions and timeouts what the senders paid for it (docs/CLUSTER.md, "Link counters").
QDISC_FIELDS = ("bytes", "packets", "drops", "overlimits", "requeues")
TCP_FIELDS = {  # /proc/net/snmp "Tcp:" and /proc/net/netstat "TcpExt:" names -> ours
    ("Tcp", "OutSegs"): "out_segs",
    ("Tcp", "RetransSegs"): "retrans_segs",
    ("TcpExt", "TCPTimeouts"): "timeouts",
    ("TcpExt", "TCPLossProbes"): "loss_probes",
    ("TcpExt", "TCPFastRetrans"): "fast_retrans",
    ("TcpExt", "TCPSlowStartRetrans"): "slow_start_retrans",
    ("TcpExt", "TCPSpuriousRTOs"): "spurious_rtos",
}


def qdisc_counters(ns: str | None, dev: str) -> dict[str, int]:
    """The shaping qdisc's cumulative counters on ``dev`` (the tbf where there is one, else the root)."""
    proc = _run(["tc"] + (["-n", ns] if ns else []) + ["-s", "-j", "qdisc", "show", "dev", dev], check=False)
    try:
        qdiscs = json.loads(proc.stdout or "[]")
    except ValueError:
        return {}
    chosen = next((q for q in qdiscs if q.get("kind") == "tbf"), qdiscs[0] if qdiscs else None)
    if not chosen:
        return {}
    return {name: int(chosen.get(name, 0)) for name in QDISC_FIELDS}


def parse_proc_net(text: str) -> dict[str, int]:
    """The TCP_FIELDS out of /proc/net/snmp and /proc/net/netstat (header line, value line pairs)."""
    found: dict[str, int] = {}
    lines = [line.split() for line in text.splitlines() if line.strip()]
    for head, values in zip(lines, lines[1:]):
        if (len(head) < 2 or len(values) != len(head) or head[0] != values[0] or not head[0].endswith(":")
                or head[1].lstrip("-").isdigit() or not values[1].lstrip("-").isdigit()):
            continue  # not a (names, values) pair of one group
        group = head[0][:-1]
        for key, value in zip(head[1:], values[1:]):
            ours = TCP_FIELDS.get((group, key))
            if ours and value.lstrip("-").isdigit():
                found[ours] = int(value)
    return found


def tcp_counters(ns: str | None) -> dict[str, int]:
    """The host's cumulative TCP counters (TCP_FIELDS) in namespace ``ns``."""
    argv = ["cat", "/proc/net/snmp", "/proc/net/netstat"]
    proc = _run((["ip", "netns", "exec", ns] if ns else []) + argv, check=False)
    return parse_proc_net(proc.stdout or "")


def counter_delta(before: dict, after: dict) -> dict:
    """``after - before`` for nested dicts of counters (keys missing before count from 0)."""
    out: dict = {}
    for key, value in after.items():
        if isinstance(value, dict):
            out[key] = counter_delta(before.get(key, {}), value)
        elif isinstance(value, int):
            out[key] = value - int(before.get(key, 0))
    return out
