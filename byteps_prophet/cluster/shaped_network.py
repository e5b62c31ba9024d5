"""The cluster's network: one namespace per host, a switch namespace with a bridge, tc-shaped links.

Every host's ``eth0`` is one end of a veth pair whose other end is a port of the switch's bridge.
Each link is shaped on both ends (the host's egress: its upload; the switch port's egress: its
download) at the host's bandwidth, with half the host's latency on each end. The names are recorded
before anything is created, so a failure half-way still removes them all.
"""
from __future__ import annotations

from byteps_prophet.cluster import netns as nets
from byteps_prophet.errors import UserError
from byteps_prophet.units import format_latency


def check_tcp_congestion(wanted: str | None, use_netns: bool) -> None:
    """A one-line error unless every host namespace can use the congestion control ``wanted``."""
    if wanted is None:
        return
    if not use_netns:
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


class Network:
    """The namespaces, links and shaping of the hosts (``local.Host``) of one cluster ``cluster_id``.

    ``namespaces`` is the caller's list: every namespace created is recorded there first, so the
    caller's teardown (even an emergency one) removes them all."""

    def __init__(self, cluster_id: str, hosts: list, namespaces: list[str], tcp_congestion: str | None = None):
        self.hosts = hosts
        self.namespaces = namespaces
        self.switch = f"{cluster_id}-sw"
        self.tcp_congestion_wanted = tcp_congestion
        for host in hosts:
            host.netns = f"{cluster_id}-{host.name}"
            host.switch_dev = host.name

    def build(self) -> None:
        nets.clean_stale()
        self.namespaces.extend(h.netns for h in self.hosts)
        self.namespaces.append(self.switch)
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
            if self.tcp_congestion_wanted:
                nets.set_tcp_congestion(host.netns, self.tcp_congestion_wanted)
        if any(h.latency_us > 0 for h in self.hosts) and not nets.netem_available(self.switch):
            worst = max(self.hosts, key=lambda h: h.latency_us)
            raise UserError(f"latency {format_latency(worst.latency_us)} needs the netem qdisc, which this "
                            f"kernel lacks (CONFIG_NET_SCH_NETEM); use --latency 0")
        self.apply_shaping()

    def apply_shaping(self) -> None:
        """Shape every link as its host now says (bandwidth, latency)."""
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

    def set_bandwidth(self, bits: int | None) -> None:
        for host in self.hosts:
            host.bandwidth = bits
        self.apply_shaping()

    def set_latency(self, micros: int) -> None:
        if micros > 0 and not nets.netem_available(self.switch):
            raise UserError(f"latency {format_latency(micros)} needs the netem qdisc, which this kernel "
                            f"lacks (CONFIG_NET_SCH_NETEM); use 0")
        for host in self.hosts:
            host.latency_us = micros
        self.apply_shaping()

    def counters(self) -> dict:
        """Per host: ``up`` (its eth0's egress) and ``down`` (the switch's port towards it) qdisc
        counters and ``tcp`` (its namespace's TCP counters)."""
        return {host.name: {"up": nets.qdisc_counters(host.netns, nets.HOST_DEV),
                            "down": nets.qdisc_counters(self.switch, host.switch_dev),
                            "tcp": nets.tcp_counters(host.netns)}
                for host in self.hosts}

    def tcp_congestion(self) -> str:
        return nets.tcp_congestion(self.hosts[0].netns)

    def kill_processes(self) -> None:
        """Kill every process left in a host namespace."""
        for host in self.hosts:
            nets.kill_namespace_processes(host.netns)
