#!/usr/bin/env python
"""One iteration of fused Prophet on the simulator's ring, collective by collective: when each was
sent, when it ended, its bytes and its pieces, beside the end of backward (docs/DESIGN.md, "Fused
collectives", "Gradient 0's collective"). Deterministic.

    .venv/bin/python scripts/trace_fusion.py resnet50 32 25        # model, workers, Gbit/s
"""
from __future__ import annotations

import argparse
import sys

from byteps_prophet.core import Settings
from byteps_prophet.core.task import Fused
from byteps_prophet.sim.costmodel import compute_times
from byteps_prophet.sim.engine import ClusterSpec, Simulation, layers_from
from byteps_prophet.sim.zoo import MODELS, get_model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", choices=sorted(MODELS))
    ap.add_argument("workers", type=int)
    ap.add_argument("gbit", type=float)
    ap.add_argument("--iteration", type=int, default=20, help="the iteration shown (of 30; default 20)")
    args = ap.parse_args()
    if args.workers < 2 or args.gbit <= 0 or not 0 <= args.iteration < 29:
        print("trace_fusion: workers >= 2, gbit > 0 and 0 <= --iteration < 29 are required", file=sys.stderr)
        return 2
    spec = get_model(args.model)
    layers = layers_from(spec, compute_times(spec, spec.default_batch))
    cluster = ClusterSpec(workers=args.workers, arch="allreduce", bandwidth=args.gbit * 1e9 / 8)
    sim = Simulation(layers, cluster, Settings(scheduler="prophet", fuse=True), 30, 10, trace_iteration=args.iteration)
    sent = []
    send = sim.network.send

    def recorded(message):
        now = sim.loop.now()
        send(message)
        sent.append((now, sim.network._free, message))

    sim.network.send = recorded
    result = sim.run()
    start = result.iteration_starts[args.iteration]
    print(f"{args.model}, {args.workers} workers, {args.gbit:g} Gbit/s: {result.iter_s * 1e3:.3f} ms per iteration; "
          f"iteration {args.iteration}: backward ends at {(result.trace.ready[0] - start) * 1e3:.3f} ms "
          f"(times from its start)")
    for sent_at, ends, message in sent:
        if message.iteration != args.iteration:
            continue
        members = message.members if type(message) is Fused else [message]
        print(f"  sent {(sent_at - start) * 1e3:9.3f}  ends {(ends - start) * 1e3:9.3f}  {message.nbytes / 1e6:9.3f} MB  "
              f"{len(members):3d} pieces  {members[0].key} .. {members[-1].key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
