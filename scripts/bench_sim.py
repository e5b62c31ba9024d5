#!/usr/bin/env python
"""Simulator benchmark: the scheduler grid, a changing-conditions run, decision cost, simulator speed.

Writes one JSON file (default out/bench_sim.json) and prints a summary. Every cell runs FIFO,
ByteScheduler with the default credit and with the best credit of a sweep, Prophet (default and
paper) and reports each as a ratio to the best credit and to the lower bound.

    .venv/bin/python scripts/bench_sim.py                 # the full grid (several minutes)
    .venv/bin/python scripts/bench_sim.py --quick         # resnet50 + vgg16, 8 workers
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from tqdm import tqdm

from byteps_prophet.core import ManualClock, Settings, Task, make_scheduler
from byteps_prophet.sim.costmodel import compute_times
from byteps_prophet.sim.engine import ClusterSpec, Simulation, layers_from
from byteps_prophet.sim.runner import CREDIT_SWEEP, compare
from byteps_prophet.sim.zoo import MODELS, get_model

GBIT = 1e9 / 8


def grid_cell(layers, cluster, iterations):
    c = compare(layers, cluster, ["fifo", "bytescheduler", "prophet"], iterations=iterations,
                warmup=min(10, iterations // 3))
    r = {name: res.iter_s for name, res in c.results.items()}
    best = r["bytescheduler_best"]
    return {
        "lower_bound_ms": c.lower_bound_s * 1e3,
        "best_credit": c.best_credit,
        "iter_ms": {k: v * 1e3 for k, v in r.items()},
        "ratio_to_best_credit": {k: v / best for k, v in r.items()},
        "ratio_to_lower_bound": {k: v / c.lower_bound_s for k, v in r.items()},
    }


def changing_conditions(iterations=80):
    model = get_model("resnet50")
    layers = layers_from(model, compute_times(model, 32))
    cluster = ClusterSpec(workers=8, arch="ps", bandwidth=10 * GBIT,
                          bandwidth_steps=((2.0, 3 * GBIT), (4.5, 25 * GBIT)),
                          compute_steps=((3.0, 1.3), (5.5, 1.0)))
    run = lambda s: Simulation(layers, cluster, s, iterations, warmup=0).run().finish_s  # noqa: E731
    static = {c: run(Settings(scheduler="bytescheduler", credit=c)) for c in CREDIT_SWEEP}
    prophet = run(Settings(scheduler="prophet"))
    paper = run(Settings(scheduler="prophet", prophet_mode="paper"))
    return {
        "setup": "resnet50, 8 workers, ps; bandwidth 10 -> 3 (t=2s) -> 25 Gbit/s (t=4.5s); compute x1.3 "
                 f"from t=3s to 5.5s; {iterations} iterations; total run time",
        "prophet_s": prophet, "prophet_paper_s": paper,
        "static_credit_s": {str(c): t for c, t in static.items()},
        "best_static_credit": min(static, key=static.get),
        "prophet_vs_best_static": prophet / min(static.values()),
        "prophet_faster_than_every_static_credit": prophet < min(static.values()),
    }


class _NullTransport:
    serializations = 2

    def __init__(self) -> None:
        self.in_flight = []

    def send(self, task) -> None:
        self.in_flight.append(task)


def decision_cost(iterations=40):
    """Wall time of one scheduler call (post or finished) in isolation: a fake clock and a transport
    that only remembers, replaying ResNet-50's ready pattern at 10 Gbit/s."""
    model = get_model("resnet50")
    times = compute_times(model, 32)
    out = {}
    for name, settings in [("bytescheduler", Settings(scheduler="bytescheduler")),
                           ("prophet", Settings(scheduler="prophet")),
                           ("prophet_paper", Settings(scheduler="prophet", prophet_mode="paper"))]:
        clock, transport = ManualClock(), _NullTransport()
        scheduler = make_scheduler(settings, clock, transport)
        samples = []

        def call(method, arg):
            t0 = time.perf_counter()
            method(arg)
            samples.append(time.perf_counter() - t0)

        for it in range(iterations):
            for i in reversed(range(len(model.tensors))):
                clock.advance(times.bwd_s[i])
                spec = model.tensors[i]
                call(scheduler.post, Task(spec.name, i, spec.shape, iteration=it))
                while transport.in_flight and len(transport.in_flight) > 2:  # the link drains as we go
                    piece = transport.in_flight.pop(0)
                    clock.advance(piece.nbytes / (10 * GBIT))
                    call(scheduler.finished, piece)
            scheduler.end_of_backward(it)
            while transport.in_flight:
                piece = transport.in_flight.pop(0)
                clock.advance(piece.nbytes / (10 * GBIT))
                call(scheduler.finished, piece)
        samples.sort()
        out[name] = {"calls": len(samples), "median_us": statistics.median(samples) * 1e6,
                     "mean_us": statistics.mean(samples) * 1e6, "p99_us": samples[int(0.99 * len(samples))] * 1e6}
    return out


def simulator_speed(repeats=3):
    model = get_model("resnet50")
    layers = layers_from(model, compute_times(model, 32))
    times = {}
    for name in ("fifo", "bytescheduler", "prophet"):
        runs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            Simulation(layers, ClusterSpec(workers=32, bandwidth=10 * GBIT), Settings(scheduler=name), 100).run()
            runs.append(time.perf_counter() - t0)
        times[name] = {"median_s": statistics.median(runs), "min_s": min(runs), "max_s": max(runs)}
    return {"setup": "resnet50, 32 workers, ps, 10 Gbit/s, 100 iterations", "wall": times}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/bench_sim.json")
    ap.add_argument("--quick", action="store_true", help="resnet50 and vgg16, 8 workers only")
    ap.add_argument("--iterations", type=int, default=30)
    args = ap.parse_args()
    models = ("resnet50", "vgg16") if args.quick else MODELS
    workers = (8,) if args.quick else (2, 8, 32)
    cells = [(m, a, w, g) for m in models for a in ("ps", "allreduce") for w in workers for g in (1, 3, 10, 25, 100)]
    grid = []
    layer_cache = {}
    for m, arch, w, g in tqdm(cells, desc="grid"):
        if m not in layer_cache:
            spec = get_model(m)
            layer_cache[m] = layers_from(spec, compute_times(spec, spec.default_batch))
        cell = grid_cell(layer_cache[m], ClusterSpec(workers=w, arch=arch, bandwidth=g * GBIT), args.iterations)
        grid.append({"model": m, "arch": arch, "workers": w, "gbit": g, **cell})
    result = {"grid": grid, "changing_conditions": changing_conditions(), "decision_cost": decision_cost(),
              "simulator_speed": simulator_speed()}
    ratios = [c["ratio_to_best_credit"]["prophet"] for c in grid]
    result["summary"] = {
        "cells": len(grid),
        "prophet_within_1pct_of_best_credit": sum(r <= 1.01 for r in ratios),
        "prophet_vs_best_credit_median": statistics.median(ratios),
        "prophet_vs_best_credit_max": max(ratios),
        "cells_where_default_credit_is_2pct_off": sum(c["ratio_to_best_credit"]["bytescheduler"] > 1.02 for c in grid),
        "of_those_prophet_faster_than_default_credit": sum(
            c["iter_ms"]["prophet"] < c["iter_ms"]["bytescheduler"] for c in grid
            if c["ratio_to_best_credit"]["bytescheduler"] > 1.02),
        "cells_above_5pct_of_lower_bound_for_best_credit": sum(
            c["ratio_to_lower_bound"]["bytescheduler_best"] > 1.05 for c in grid),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))
    print(json.dumps({k: result["changing_conditions"][k] for k in ("prophet_vs_best_static", "prophet_faster_than_every_static_credit")}))
    print(json.dumps(result["decision_cost"]))
    print(json.dumps(result["simulator_speed"]["wall"]))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
