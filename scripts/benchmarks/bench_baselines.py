#!/usr/bin/env python
"""Simulator grid: Prophet against what a torch user runs instead, DDP's buckets and Horovod's fusion.

Every all-reduce cell (model x workers x bandwidth) simulates FIFO, Prophet (default mode), DDP with
its default bucket (25 MiB, first 1 MiB) and with the best bucket of ``BUCKET_SWEEP``, and Horovod with
its defaults (1 ms cycle, 128 MiB buffer), and reports Prophet against the better of DDP's best
bucket and Horovod. Beside the lower bound (ALGORITHMS.md section 4) each cell carries the
*no-fusion bound*: the same bound for a schedule that sends every gradient in at least one message of
its own (ByteScheduler and FIFO never put two gradients in one message; Prophet fuses them on
all-reduce since docs/DESIGN.md, "Fused collectives"), which pays one collective's fixed cost
(``2(n-1)`` ring steps of per-message overhead and latency) per gradient. A column
``prophet_partition_16m`` runs Prophet with ``BYTESCHEDULER_PARTITION=16000000`` (its queued pieces 16
times larger than by default). ``prophet_messages_per_iteration`` counts collectives (a fused one once).

    .venv/bin/python scripts/benchmarks/bench_baselines.py --out out/bench_baselines.json \\
        --compact scripts/benchmarks/data/bench_baselines_results.json
    .venv/bin/python scripts/benchmarks/bench_baselines.py --quick      # resnet50 + vgg16, 8 workers
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from bench_sim import write_compact  # scripts/ is on the path when run as a script
from byteps_prophet.core import Settings
from byteps_prophet.sim.baseline_runs import BUCKET_SWEEP, best_bucket, simulate_baseline
from byteps_prophet.sim.costmodel import compute_times
from byteps_prophet.sim.simulation import SimulatedCluster, Simulation, layers_from, lower_bound_s
from byteps_prophet.sim.zoo import MODELS, get_model

GBIT = 1e9 / 8
COLUMNS = ("fifo", "prophet", "prophet_partition_16m", "ddp", "ddp_best", "horovod")
LARGE_PARTITION = 16_000_000  # elements: Prophet with BYTESCHEDULER_PARTITION=16000000, fewer messages


def no_fusion_bound_s(layers, cluster) -> float:
    """The lower bound for a schedule that never fuses gradients: every byte through the ring once,
    and at least one collective, with its fixed cost, per gradient."""
    per_collective = (2 * (cluster.workers - 1) * (cluster.overhead + cluster.latency)
                      if cluster.workers > 1 else cluster.overhead)
    total = sum(math.prod(layer.shape) * layer.itemsize for layer in layers)
    network = Simulation(layers, cluster, Settings()).network
    return max(lower_bound_s(layers, cluster), network.comm_time(total, cluster.bandwidth) + len(layers) * per_collective)


def cell(layers, cluster, iterations: int) -> dict:
    warmup = min(10, iterations // 3)
    times = {}
    for name in ("fifo", "prophet"):
        times[name] = Simulation(layers, cluster, Settings(scheduler=name, fuse=name == "prophet"), iterations, warmup).run().iter_s
    times["prophet_partition_16m"] = Simulation(layers, cluster, Settings(scheduler="prophet", partition=LARGE_PARTITION, fuse=True),
                                                iterations, warmup).run().iter_s
    result = simulate_baseline("ddp", layers, cluster, iterations, warmup)
    times["ddp"] = result.iter_s
    (bucket,), sweep, _ = best_bucket(layers, cluster, iterations, warmup)
    times["ddp_best"] = sweep[(bucket,)]
    times["horovod"] = simulate_baseline("horovod", layers, cluster, iterations, warmup).iter_s
    prophet_messages = _messages_per_iteration(layers, cluster, iterations, warmup)
    best_baseline = min(times["ddp_best"], times["horovod"])
    bound, no_fusion = lower_bound_s(layers, cluster), no_fusion_bound_s(layers, cluster)
    return {
        "lower_bound_ms": bound * 1e3,
        "no_fusion_bound_ms": no_fusion * 1e3,
        "best_bucket": bucket,
        "bucket_sweep_ms": {str(b): t * 1e3 for (b,), t in sweep.items()},
        "iter_ms": {k: v * 1e3 for k, v in times.items()},
        "prophet_vs_best_baseline": times["prophet"] / best_baseline,
        "prophet_vs_ddp": times["prophet"] / times["ddp"],
        "prophet_partition_16m_vs_best_baseline": times["prophet_partition_16m"] / best_baseline,
        "no_fusion_bound_vs_best_baseline": no_fusion / best_baseline,
        "prophet_messages_per_iteration": prophet_messages,
        "ddp_collectives_per_iteration": len(result.sent) / iterations,
    }


def _messages_per_iteration(layers, cluster, iterations, warmup) -> float:
    result = Simulation(layers, cluster, Settings(scheduler="prophet", fuse=True), iterations, warmup).run()
    steady = [iteration for iteration in result.messages if iteration >= warmup]  # collectives, fused once
    return len(steady) / max(1, iterations - warmup)


def summarize(grid) -> dict:
    ratios = [c["prophet_vs_best_baseline"] for c in grid]
    misses = [c for c in grid if c["prophet_vs_best_baseline"] > 1.01]
    return {
        "cells": len(grid),
        "prophet_within_1pct_of_best_baseline": len(grid) - len(misses),
        "prophet_vs_best_baseline_median": statistics.median(ratios),
        "prophet_vs_best_baseline_min": min(ratios),
        "prophet_vs_best_baseline_max": max(ratios),
        "prophet_at_least_as_fast_as_ddp_default": sum(c["prophet_vs_ddp"] <= 1.0 for c in grid),
        "misses_excluded_by_no_fusion_bound": sum(c["no_fusion_bound_vs_best_baseline"] > 1.01 for c in misses),
        "prophet_partition_16m_within_1pct_of_best_baseline": sum(
            c["prophet_partition_16m_vs_best_baseline"] <= 1.01 for c in grid),
        "misses": [f"{c['model']}/{c['workers']}w/{c['gbit']}G: {c['prophet_vs_best_baseline']:.4f} "
                   f"(no-fusion bound {c['no_fusion_bound_vs_best_baseline']:.4f})" for c in misses],
    }


def compact(result: dict) -> dict:
    rows = [[c["model"], c["workers"], c["gbit"], round(c["lower_bound_ms"], 3), round(c["no_fusion_bound_ms"], 3),
             c["best_bucket"], *(round(c["iter_ms"][k], 3) for k in COLUMNS),
             round(c["prophet_vs_best_baseline"], 4), round(c["prophet_messages_per_iteration"], 1),
             round(c["ddp_collectives_per_iteration"], 1)]
            for c in result["grid"]]
    return {"setup": result["setup"],
            "columns": ["model", "workers", "gbit", "lower_bound_ms", "no_fusion_bound_ms", "best_bucket_bytes",
                        *(f"{k}_ms" for k in COLUMNS), "prophet_vs_best_baseline", "prophet_messages_per_iteration",
                        "ddp_collectives_per_iteration"],
            "grid": rows, "summary": result["summary"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/bench_baselines.json")
    ap.add_argument("--compact", metavar="JSON", help="also write a compact copy (scripts/benchmarks/data/bench_baselines_results.json)")
    ap.add_argument("--quick", action="store_true", help="resnet50 and vgg16, 8 workers only")
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--workers", default="2,8,32", help="comma-separated worker counts (default 2,8,32)")
    ap.add_argument("--gbit", default="1,3,10,25,100", help="comma-separated bandwidths, Gbit/s")
    args = ap.parse_args()
    try:
        workers = tuple(int(w) for w in args.workers.split(","))
        gbits = tuple(float(g) for g in args.gbit.split(","))
        if min(workers) < 1 or min(gbits) <= 0 or args.iterations < 3:
            raise ValueError
    except ValueError:
        print(f"bench_baselines: --workers {args.workers!r} / --gbit {args.gbit!r} / --iterations {args.iterations} "
              "is invalid; valid: comma-separated positive numbers, iterations >= 3", file=sys.stderr)
        return 2
    models = ("resnet50", "vgg16") if args.quick else MODELS
    if args.quick:
        workers = (8,)
    grid = []
    for m in models:
        spec = get_model(m)
        layers = layers_from(spec, compute_times(spec, spec.default_batch))
        for w in workers:
            for g in gbits:
                c = cell(layers, SimulatedCluster(workers=w, arch="allreduce", bandwidth=g * GBIT), args.iterations)
                grid.append({"model": m, "arch": "allreduce", "workers": w, "gbit": g, **c})
                print(f"{m:>13} {w:>3}w {g:>5g}G  prophet/best {c['prophet_vs_best_baseline']:.4f}  "
                      f"prophet/ddp {c['prophet_vs_ddp']:.4f}  16M partition/best {c['prophet_partition_16m_vs_best_baseline']:.4f}  no-fusion bound/best "
                      f"{c['no_fusion_bound_vs_best_baseline']:.4f}", file=sys.stderr)
    result = {"setup": {"arch": "allreduce", "iterations": args.iterations, "warmup": min(10, args.iterations // 3),
                        "batch": "each model's default", "device": "cost model default", "overhead_s": SimulatedCluster().overhead,
                        "bucket_sweep_bytes": list(BUCKET_SWEEP), "horovod": "cycle 1 ms, fusion 128 MiB",
                        "ddp": "bucket 25 MiB, first bucket 1 MiB"},
              "grid": grid}
    result["summary"] = summarize(grid)
    print(json.dumps(result["summary"], indent=1))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    if args.compact:
        write_compact(args.compact, compact(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
