"""Shape this host's own link, for the Docker entrypoint: ``python -m byteps_prophet.cluster.container_shaping``.

Under Docker the far end of a container's link is the Docker bridge, out of reach, so the container
shapes both directions itself: egress on its device, ingress through an ifb device that the ingress
traffic is redirected to. Same tbf/netem layout and units as the local cluster (half the latency
on each direction, so host to host adds the whole latency one way).

Settings come from the environment (the compose file sets them; cluster/container.py reads them) or the options:
LINK_BANDWIDTH (e.g. 1gbit, none), LINK_LATENCY (e.g. 0ms, 1ms), LINK_DEVICE (eth0),
LINK_SHAPING=0 to leave the link alone.
"""
from __future__ import annotations

import argparse
import sys

from byteps_prophet.cluster import netns
from byteps_prophet.cluster.container import container
from byteps_prophet.units import format_bandwidth, format_latency, parse_bandwidth, parse_latency
from byteps_prophet.errors import ConfigError, UserError

IFB = "bpp-ifb0"


def shape_own_link(device: str, bits: int | None, delay_us: int, warn=print) -> list[str]:
    """Apply shaping to ``device`` in both directions; returns what was done, one line each."""
    half = delay_us // 2
    done = []
    egress = netns.shaping_batch(netns.Link("", device), bits, half)
    netns.tc_batch(egress, None, check=not egress[0].startswith("qdisc del"))
    done.append(f"{device} egress: {format_bandwidth(bits)}, +{format_latency(half)}")
    if not bits and delay_us - half == 0:
        return done
    try:
        netns.ip_batch([f"link add {IFB} type ifb"], check=False)
        netns.ip_batch([f"link set {IFB} up"])
        netns.tc_batch([f"qdisc replace dev {device} handle ffff: ingress",
                        f"filter replace dev {device} parent ffff: protocol all prio 1 u32 match u32 0 0 "
                        f"action mirred egress redirect dev {IFB}"], None)
        netns.tc_batch(netns.shaping_batch(netns.Link("", IFB), bits, delay_us - half), None)
        done.append(f"{device} ingress (via {IFB}): {format_bandwidth(bits)}, +{format_latency(delay_us - half)}")
    except UserError as err:
        warn(f"linkshape: warning: ingress of {device} not shaped ({err}); only egress is")
    return done


def main(argv: list[str] | None = None) -> int:
    try:
        job = container()
    except ConfigError as err:
        print(f"linkshape: error: {err}", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog="python -m byteps_prophet.cluster.container_shaping",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=job.link_device)
    parser.add_argument("--bandwidth", default=job.link_bandwidth)
    parser.add_argument("--latency", default=job.link_latency)
    args = parser.parse_args(argv)
    if not job.link_shaping:
        print("linkshape: LINK_SHAPING is off; link left unshaped")
        return 0
    try:
        bits = parse_bandwidth(args.bandwidth, "LINK_BANDWIDTH")
        delay = parse_latency(args.latency, "LINK_LATENCY")
        for line in shape_own_link(args.device, bits, delay, warn=lambda m: print(m, file=sys.stderr)):
            print(f"linkshape: {line}")
    except UserError as err:
        hint = " (the container needs cap_add: NET_ADMIN)" if "not permitted" in str(err) else ""
        print(f"linkshape: error: {err}{hint}; LINK_SHAPING=0 leaves the link unshaped", file=sys.stderr)
        return 2
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
