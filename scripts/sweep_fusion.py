#!/usr/bin/env python
"""Prophet's fusion floor (core/prophet.py FUSION_LATENCIES) swept over the all-reduce grid, Prophet
alone, against the DDP (best bucket) and Horovod times of a bench_baselines compact file (those do
not depend on Prophet). Deterministic; a few seconds per value. docs/DESIGN.md, "Fused collectives".

    .venv/bin/python scripts/sweep_fusion.py --floors 4,8,16,32,64
    .venv/bin/python scripts/sweep_fusion.py --scale   # Prophet on bench_sim's committed scale cells
    .venv/bin/python scripts/sweep_fusion.py --ideal   # Prophet on bench_sim's committed ideal grid

``--scale`` re-runs Prophet alone (the current floor) on every cell of the scale grid committed in
docs/bench_sim_results.json (calibrated engines, 2-256 workers) and compares it with the committed
Prophet and ByteScheduler times: parameter-server cells must be unchanged (Prophet never fuses there).
``--ideal`` does the same on the ideal grid (150 cells) against its best credit.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import byteps_prophet.core.prophet as prophet_module
from byteps_prophet.core import EngineTraits, Settings
from byteps_prophet.sim.costmodel import compute_times
from byteps_prophet.sim.engine import ClusterSpec, Simulation, layers_from
from byteps_prophet.sim.zoo import get_model

GBIT = 1e9 / 8


def sweep(baselines: dict, floor: float, iterations: int = 30, warmup: int = 10) -> dict:
    prophet_module.FUSION_LATENCIES = floor
    col = {c: i for i, c in enumerate(baselines["columns"])}
    layers_of, ratios, misses = {}, [], []
    for row in baselines["grid"]:
        model, workers, gbit = row[col["model"]], row[col["workers"]], row[col["gbit"]]
        if model not in layers_of:
            spec = get_model(model)
            layers_of[model] = layers_from(spec, compute_times(spec, spec.default_batch))
        cluster = ClusterSpec(workers=workers, arch="allreduce", bandwidth=gbit * GBIT)
        result = Simulation(layers_of[model], cluster, Settings(scheduler="prophet", fuse=True), iterations, warmup).run()
        ratio = result.iter_s * 1e3 / min(row[col["ddp_best_ms"]], row[col["horovod_ms"]])
        ratios.append(ratio)
        if ratio > 1.01:
            messages = sum(1 for it in result.messages if it >= warmup) / (iterations - warmup)
            misses.append(f"{model}/{workers}w/{gbit:g}G {ratio:.4f} ({messages:.0f} collectives a step)")
    return {"fusion_latencies": floor, "cells": len(ratios), "within_1pct": len(ratios) - len(misses),
            "median": round(statistics.median(ratios), 4), "min": round(min(ratios), 4),
            "max": round(max(ratios), 4), "misses": misses}


def scale(path: str = "docs/bench_sim_results.json") -> dict:
    sys.path.insert(0, "scripts")
    from bench_sim import SCALE_CASES

    with open(path, encoding="utf-8") as f:
        grid = json.load(f)["scale"]
    engines = {arch: EngineTraits.from_dict(t) for arch, t in grid["setup"]["engines"].items()}
    iterations, warmup = grid["setup"]["iterations"], grid["setup"]["warmup"]
    col = {c: i for i, c in enumerate(grid["columns"])}
    out: dict = {}
    for row in grid["cells"]:
        model, arch, case, workers, gbit = (row[col[k]] for k in ("model", "arch", "case", "workers", "gbit"))
        spec = get_model(model)
        layers = layers_from(spec, compute_times(spec, spec.default_batch))
        changes = {"servers": workers if arch == "ps" else None, **SCALE_CASES[case](workers)}
        cluster = ClusterSpec(workers=workers, arch=arch, bandwidth=gbit * GBIT, engine=engines[arch], **changes)
        now = Simulation(layers, cluster, Settings(scheduler="prophet", fuse=True), iterations, warmup).run().iter_s * 1e3
        entry = out.setdefault(arch, {"cells": 0, "changed": 0, "now_vs_before": [], "now_vs_best_credit": [],
                                      "now_vs_default_credit": []})
        entry["cells"] += 1
        entry["changed"] += abs(now - row[col["prophet_ms"]]) > 1e-3
        entry["now_vs_before"].append(now / row[col["prophet_ms"]])
        entry["now_vs_best_credit"].append(now / row[col["bytescheduler_best_ms"]])
        entry["now_vs_default_credit"].append(now / row[col["bytescheduler_ms"]])
    for entry in out.values():
        for key in ("now_vs_before", "now_vs_best_credit", "now_vs_default_credit"):
            values = entry[key]
            entry[key] = {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
                          "max": round(max(values), 4)}
    return out


def ideal(path: str = "docs/bench_sim_results.json") -> dict:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    iterations, warmup = data["grid_setup"]["iterations"], data["grid_setup"]["warmup"]
    col = {c: i for i, c in enumerate(data["grid_columns"])}
    out: dict = {}
    for row in data["grid"]:
        model, arch, workers, gbit = (row[col[k]] for k in ("model", "arch", "workers", "gbit"))
        spec = get_model(model)
        layers = layers_from(spec, compute_times(spec, spec.default_batch))
        cluster = ClusterSpec(workers=workers, arch=arch, bandwidth=gbit * GBIT)
        now = Simulation(layers, cluster, Settings(scheduler="prophet", fuse=True), iterations, warmup).run().iter_s * 1e3
        entry = out.setdefault(arch, {"cells": 0, "changed": 0, "within_1pct_of_best_credit": 0, "ratios": [],
                                      "vs_before": []})
        ratio = now / row[col["bytescheduler_best_ms"]]
        entry["cells"] += 1
        entry["changed"] += abs(now - row[col["prophet_ms"]]) > 1e-3
        entry["within_1pct_of_best_credit"] += ratio <= 1.01
        entry["ratios"].append(ratio)
        entry["vs_before"].append(now / row[col["prophet_ms"]])
    for entry in out.values():
        for key in ("ratios", "vs_before"):
            values = entry[key]
            entry[key] = {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
                          "max": round(max(values), 4)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--floors", default="4,8,16,32,64", help="comma-separated FUSION_LATENCIES values")
    ap.add_argument("--baselines", default="docs/bench_baselines_results.json")
    ap.add_argument("--scale", action="store_true", help="Prophet on the committed scale grid's cells instead")
    ap.add_argument("--ideal", action="store_true", help="Prophet on the committed ideal grid's cells instead")
    args = ap.parse_args()
    if args.scale or args.ideal:
        print(json.dumps(scale() if args.scale else ideal(), indent=1))
        return 0
    try:
        floors = [float(f) for f in args.floors.split(",")]
        if min(floors) <= 0:
            raise ValueError
    except ValueError:
        print(f"sweep_fusion: --floors {args.floors!r} is invalid; valid: comma-separated positive numbers",
              file=sys.stderr)
        return 2
    try:
        with open(args.baselines, encoding="utf-8") as f:
            baselines = json.load(f)
    except (OSError, ValueError) as err:
        print(f"sweep_fusion: --baselines {args.baselines!r} is not readable JSON ({err}); valid: a file "
              "written by scripts/bench_baselines.py --compact", file=sys.stderr)
        return 2
    for floor in floors:
        print(json.dumps(sweep(baselines, floor)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
