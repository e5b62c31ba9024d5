#!/usr/bin/env python
"""How busy the server's link was, 5 ms at a time, against a run's trace (docs/ENGINE.md, "Prophet's
pauses on BytePS, measured").

``sample`` runs beside an A/B (root): it waits for the switch namespace of the cluster that process
PID controls (``bpp-<PID>-<n>-sw``), then records every switch port's byte counters (a port's
``tx_bytes`` is what its host received, ``rx_bytes`` what it sent) every PERIOD seconds as JSON
lines, until the namespace is gone. ``idle`` reads those samples with a rank's trace
(``ab --record``) and prints, from the trace's third step to its last, the server's ingress (the
workers' pushes) and egress rates, the time each was idle (a bin under 10% of RATE), the rate
of the busy bins, and every stretch of 0.1 s or more with both directions idle.

    flock /tmp/bench.lock byteps-prophet ab ... --record DIR & 
    sudo .venv/bin/python scripts/link_timeline.py sample $! samples.jsonl
    .venv/bin/python scripts/link_timeline.py idle samples.jsonl DIR/prophet_r0.trace.json --rate 25e6
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def sample(pid: int, out: str, period: float) -> int:
    deadline = time.monotonic() + 600
    ns = None
    while ns is None:
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split("\n")
        found = [n.split()[0] for n in names if n.startswith(f"bpp-{pid}-") and n.split()[0].endswith("-sw")]
        if found:
            ns = found[0]
        elif time.monotonic() > deadline or not os.path.exists(f"/proc/{pid}"):
            print(f"link_timeline: no cluster of process {pid} appeared", file=sys.stderr)
            return 2
        else:
            time.sleep(0.2)
    time.sleep(1.0)  # its ports are added right after the namespace
    code = ("import json,os,sys,time\n"
            "base='/sys/class/net'; devs=[d for d in os.listdir(base) if d not in ('lo','br0')]\n"
            "fs=[open(f'{base}/{d}/statistics/{k}_bytes') for d in devs for k in ('rx','tx')]\n"
            "out=open(sys.argv[1],'w',buffering=1); out.write(json.dumps({'devs':devs})+'\\n')\n"
            "while True:\n"
            "  row=[time.monotonic()]\n"
            "  try:\n"
            "    for f in fs: f.seek(0); row.append(int(f.read()))\n"
            "  except OSError: break\n"
            "  out.write(json.dumps(row)+'\\n'); time.sleep(float(sys.argv[2]))\n")
    # ends when the cluster deletes its namespaces (it kills what runs there)
    subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code, out, str(period)])
    return 0


def idle(samples: str, trace_path: str, rate: float, bin_s: float, host: str) -> int:
    from byteps_prophet.core import trace

    with open(samples) as f:
        lines = f.read().splitlines()
    devs = json.loads(lines[0])["devs"]
    if host not in devs:
        print(f"link_timeline: no port {host!r}; ports: {', '.join(devs)}", file=sys.stderr)
        return 2
    rows = [json.loads(line) for line in lines[1:] if line.strip()]
    steps = sorted(trace.seconds(e["ts"]) for e in trace.events(trace.load(trace_path), "step"))
    if len(steps) < 4:
        print(f"link_timeline: {trace_path} has fewer than 4 steps", file=sys.stderr)
        return 2
    t0, t1 = steps[2], steps[-1]
    k = devs.index(host)
    bins: dict[int, list[int]] = {}
    for prev, row in zip(rows, rows[1:]):
        if t0 <= row[0] <= t1:
            b = bins.setdefault(int((row[0] - t0) / bin_s), [0, 0])
            b[0] += row[2 + 2 * k] - prev[2 + 2 * k]  # tx of its port: pushes reaching the server
            b[1] += row[1 + 2 * k] - prev[1 + 2 * k]  # rx of its port: pulls leaving it
    n = max(1, int((t1 - t0) / bin_s))
    cap = rate * bin_s
    got = [bins.get(i, [0, 0]) for i in range(n)]
    span = n * bin_s
    busy = [b[0] / bin_s / 1e6 for b in got if b[0] >= 0.5 * cap]
    print(f"{trace_path}: {span:.2f} s ({len(steps) - 3} steps): {host} ingress {sum(b[0] for b in got) / span / 1e6:.2f} MB/s, "
          f"egress {sum(b[1] for b in got) / span / 1e6:.2f} MB/s; ingress idle {sum(b[0] < 0.1 * cap for b in got) / n:.0%}, "
          f"both idle {sum(max(b) < 0.1 * cap for b in got) / n:.0%}; busy ingress bins: median "
          f"{statistics.median(busy) if busy else 0:.2f} MB/s")
    start = None
    for i in range(n + 1):
        quiet = i < n and max(got[i]) < 0.1 * cap
        if quiet and start is None:
            start = i
        elif not quiet and start is not None:
            if (i - start) * bin_s >= 0.1:
                print(f"  both idle {(i - start) * bin_s:.2f} s from +{start * bin_s:.2f} s")
            start = None
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("sample", help="record the switch's port counters of PID's cluster")
    s.add_argument("pid", type=int)
    s.add_argument("out")
    s.add_argument("--period", type=float, default=0.005)
    i = sub.add_parser("idle", help="the server link's busy and idle time over a trace's steps")
    i.add_argument("samples")
    i.add_argument("trace")
    i.add_argument("--rate", type=float, default=25e6, help="the shaped rate, bytes/s (default 25e6: 200 Mbit/s)")
    i.add_argument("--bin", type=float, default=0.02, help="seconds per bin (default 0.02)")
    i.add_argument("--host", default="server-0")
    args = parser.parse_args(argv)
    if args.what == "sample":
        return sample(args.pid, args.out, args.period)
    try:
        return idle(args.samples, args.trace, args.rate, args.bin, args.host)
    except (OSError, ValueError) as err:
        parser.exit(2, f"link_timeline: {err}\n")


if __name__ == "__main__":
    sys.exit(main())
