#!/usr/bin/env python3
"""A late worker on a parameter server: how a burst finishes when one worker pushes later.

Both workers of a 2-worker, 1-server BytePS cluster issue the same burst of 1 MB push_pulls (8 ops);
worker 1 issues it DELAY seconds after worker 0 (0, 0.25 and 0.5 s, three times each). Prints, per
run, when each worker's first and last op completed. The question it answers for the simulator
(docs/history/ENGINE-replay-investigations.md, "Followers apart"): does worker 0's stream get the
server's whole ingress while worker 1 has not started (work-conserving), or only its fair share?

    flock /tmp/bench.lock .venv/bin/python scripts/late_worker.py [--bandwidth 200mbit] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DELAYS = (0.0, 0.25, 0.5)
REPS, OPS, SIZE_INDEX = 3, 8, 3  # the probe's size 3: 262 144 elements, 1 MB


def worker() -> None:
    """One worker's part (run by the cluster on every worker)."""
    from byteps_prophet.backends.rendezvous import rendezvous
    from byteps_prophet.calibrate import probe

    rank, _ = rendezvous().rank_and_size()
    engine = probe.ENGINES["byteps"](probe.SIZES, [OPS] * len(probe.SIZES))
    probe.Probe(engine, factor=2.0, leader=rank == 0).warmup()
    runs = []
    for delay in DELAYS * REPS:
        engine.barrier()
        time.sleep(0.05)
        engine.barrier()
        t0 = time.monotonic()
        if rank == 1:
            time.sleep(delay)
        handles = [engine.start(SIZE_INDEX, slot) for slot in range(OPS)]
        done = []
        for handle in handles:
            engine.wait(handle)
            done.append(round(time.monotonic() - t0, 4))
        runs.append({"delay": delay, "done": done})
    print("#late " + json.dumps({"rank": rank, "runs": runs}), flush=True)
    engine.barrier()
    os._exit(0)  # BytePS's threads can keep a finished worker alive at teardown


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bandwidth", default="200mbit", help="the shaped link rate (default 200mbit)")
    p.add_argument("--json", action="store_true", help="print the runs as JSON instead of a table")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker()
        return 0
    sys.path.insert(0, str(ROOT))
    from byteps_prophet.cluster import Cluster, ClusterSpec
    from byteps_prophet.errors import UserError
    from byteps_prophet.units import parse_bandwidth

    try:
        if not parse_bandwidth(args.bandwidth, "--bandwidth"):
            raise UserError(f"--bandwidth {args.bandwidth!r}: the question needs a shaped link; valid: a rate")
        spec = ClusterSpec(workers=2, servers=1, bandwidth=args.bandwidth, engine="byteps", grace=1.0)
        with Cluster(spec, output=lambda role, line: None) as cluster:
            result = cluster.run([sys.executable, str(Path(__file__).resolve()), "--worker"],
                                 env={"PYTHONPATH": str(ROOT)}, timeout=300)
    except UserError as err:
        print(f"late_worker: {err}", file=sys.stderr)
        return 2
    if not result.ok:
        print(f"late_worker: {result.failed or 'a role'} failed: {result.reason}", file=sys.stderr)
        return 1
    runs = {}
    for role in ("worker-0", "worker-1"):
        for line in result.output.get(role, []):
            if line.startswith("#late "):
                runs[role] = json.loads(line[len("#late "):])["runs"]
    if args.json:
        print(json.dumps(runs))
        return 0
    print("| worker 1 late by | worker 0 first / last done | worker 1 first / last done |")
    print("| --- | --- | --- |")
    for first, second in zip(runs["worker-0"], runs["worker-1"]):
        print(f"| {first['delay']:.2f} s | {first['done'][0]:.3f} / {first['done'][-1]:.3f} s "
              f"| {second['done'][0]:.3f} / {second['done'][-1]:.3f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
