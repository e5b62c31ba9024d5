#!/usr/bin/env python
"""Simulator benchmark: the scheduler grid, a changing-conditions run, decision cost, simulator speed,
and the scale grid (calibrated engines, 2-256 workers, 1-100 Gbit/s, stragglers, fewer servers).

Writes one JSON file (default out/bench_sim.json) and prints a summary. Every grid cell runs FIFO,
ByteScheduler with the default credit and with the best credit of a sweep, Prophet (default and
paper) and reports each as a ratio to the best credit and to the lower bound. Every scale cell runs
Prophet and every baseline at its defaults and at the best of its own sweep on the same engine:
ByteScheduler's credit and partition together, and on all-reduce DDP's bucket and Horovod's cycle
time and fusion threshold, each sweep widened while its best sits at an edge (sim/sweeps.py; a cell
lists the knobs whose best still does, ``open_edges``); it reports Prophet against each.

    .venv/bin/python scripts/benchmarks/bench_sim.py                 # the full grid (several minutes)
    .venv/bin/python scripts/benchmarks/bench_sim.py --quick         # resnet50 + vgg16, 8 workers
    .venv/bin/python scripts/benchmarks/bench_sim.py --parts scale --out out/bench_scale.json --jobs 2 \\
        --compact-scale scripts/benchmarks/data/bench_sim_scale.json  # the scale grid (tens of minutes)
    .venv/bin/python scripts/benchmarks/bench_sim.py --parts scale --quick  # its homogeneous cells at 8, 256 workers
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from tqdm import tqdm

from byteps_prophet.core import EngineTraits, ManualClock, Settings, Task, make_scheduler
from byteps_prophet.core.traits import load_engine
from byteps_prophet.sim.costmodel import compute_times
from byteps_prophet.sim.simulation import SimulatedCluster, Simulation, layers_from, lower_bound_s
from byteps_prophet.sim.baseline_runs import (BUCKET_SWEEP, CYCLE_SWEEP, FUSION_SWEEP, best_bucket, best_horovod,
                                              simulate_baseline)
from byteps_prophet.sim.runner import CREDIT_SWEEP, PARTITION_SWEEP, best_bytescheduler, compare, variant_settings
from byteps_prophet.sim.sweeps import WIDENINGS
from byteps_prophet.sim.zoo import MODELS, get_model

GBIT = 1e9 / 8


def message_bound_s(layers, cluster, partition=Settings().partition) -> float:
    """The lower bound with per-message costs: ByteScheduler and Prophet never put more than one
    partition in a message, so the bottleneck carries every byte and at least one message per
    partition, each paying its fixed cost (``lower_bound_s`` ignores those). Not a bound for FIFO,
    which sends whole tensors."""
    network = Simulation(layers, cluster, Settings()).network
    messages = sum(len(Task(layer.name, i, layer.shape, layer.itemsize).partition(partition))
                   for i, layer in enumerate(layers))
    if cluster.arch == "allreduce" and cluster.workers > 1:
        per_message = 2 * (cluster.workers - 1) * (cluster.overhead + cluster.latency)
    else:
        per_message = cluster.overhead
    total = sum(math.prod(layer.shape) * layer.itemsize for layer in layers)
    return max(lower_bound_s(layers, cluster), network.comm_time(total, cluster.bandwidth) + messages * per_message)


def add_message_bound(cell, layers, cluster) -> None:
    bound = message_bound_s(layers, cluster)
    cell["message_bound_ms"] = bound * 1e3
    cell["ratio_to_message_bound"] = {k: v / cell["message_bound_ms"] for k, v in cell["iter_ms"].items()
                                      if k != "fifo"}


def grid_cell(layers, cluster, iterations):
    warmup = min(10, iterations // 3)
    c = compare(layers, cluster, ["fifo", "bytescheduler", "prophet"], iterations=iterations, warmup=warmup)
    r = {name: res.iter_s for name, res in c.results.items()}
    best = r["bytescheduler_best"]
    return {
        "lower_bound_ms": c.lower_bound_s * 1e3,
        "best_credit": c.best_credit,
        "iter_ms": {k: v * 1e3 for k, v in r.items()},
        "ratio_to_best_credit": {k: v / best for k, v in r.items()},
        "ratio_to_lower_bound": {k: v / c.lower_bound_s for k, v in r.items()},
    }


CHANGING_CASES = (("resnet50", "ps"), ("vgg16", "ps"), ("resnet50", "allreduce"), ("vgg16", "allreduce"))


def changing_case(model_name, arch, iterations):
    model = get_model(model_name)
    layers = layers_from(model, compute_times(model, 32))
    cluster = SimulatedCluster(workers=8, arch=arch, bandwidth=10 * GBIT,
                          bandwidth_steps=((2.0, 3 * GBIT), (4.5, 25 * GBIT)),
                          compute_steps=((3.0, 1.3), (5.5, 1.0)))
    run = lambda s: Simulation(layers, cluster, s, iterations, warmup=0).run().finish_s  # noqa: E731
    static = {c: run(Settings(scheduler="bytescheduler", credit=c)) for c in CREDIT_SWEEP}
    prophet = run(Settings(scheduler="prophet"))
    return {
        "model": model_name, "arch": arch,
        "prophet_s": prophet, "prophet_paper_s": run(Settings(scheduler="prophet", prophet_mode="paper")),
        "static_credit_s": {str(c): t for c, t in static.items()},
        "best_static_credit": min(static, key=static.get),
        "prophet_vs_best_static": prophet / min(static.values()),
        "prophet_vs_default_credit": prophet / static[Settings().credit],
        "prophet_faster_than_every_static_credit": prophet < min(static.values()),
    }


def changing_conditions(iterations=80):
    cases = [changing_case(m, a, iterations) for m, a in CHANGING_CASES]
    return {
        "setup": "8 workers, batch 32; bandwidth 10 -> 3 (t=2s) -> 25 Gbit/s (t=4.5s); compute x1.3 from t=3s "
                 f"to 5.5s; {iterations} iterations; total run time against every static credit",
        "cases": cases,
        "prophet_faster_than_every_static_credit": f"{sum(c['prophet_faster_than_every_static_credit'] for c in cases)}"
                                                   f"/{len(cases)}",
    }


class _NullTransport:
    traits = EngineTraits(stages=2)

    def __init__(self) -> None:
        self.in_flight = []
        self.sent = 0

    def send(self, task) -> None:
        self.in_flight.append(task)
        self.sent += 1


def decision_cost(iterations=40, gbit=10, repeats=3):
    """What one scheduling decision costs: the wall time the scheduler spends handling one event.

    Every event is timed, as real training delivers them: ``post`` (a gradient is ready),
    ``finished`` (a slice is synchronised) and ``end_of_backward``, each including everything the
    scheduler does in reaction (its dispatcher and the ``transport.send`` calls it makes; the
    transport here only records the slice, so the network's own cost is excluded). The median and
    p90 are per event; ``mean_us`` is the total time over all events divided by their number (the
    amortised cost, which also charges the rare expensive events: re-profiling, large partitions).
    ResNet-50's ready pattern is replayed on a fake clock; the link serves two slices at a time at
    ``gbit`` Gbit/s."""
    model = get_model("resnet50")
    times = compute_times(model, 32)
    rate = gbit * GBIT
    variants = [("fifo", Settings(scheduler="fifo")), ("bytescheduler", Settings(scheduler="bytescheduler")),
                ("prophet", Settings(scheduler="prophet")),
                ("prophet_paper", Settings(scheduler="prophet", prophet_mode="paper"))]
    rounds = {name: [] for name, _ in variants}
    load = os.getloadavg()[0]
    for _ in range(repeats):  # schedulers interleaved, so a busy spell of the machine hits them all
        for name, settings in variants:
            rounds[name].append(_replay(model, times, rate, settings, iterations))
    out = {}
    for name, runs in rounds.items():
        entry = {"events": runs[0]["events"], "sends": runs[0]["sends"]}
        for stat in ("median_us", "p90_us", "p99_us", "mean_us"):
            values = sorted(run[stat] for run in runs)
            entry[stat] = statistics.median(values)
            entry[stat.replace("_us", "_range_us")] = [values[0], values[-1]]
        out[name] = entry
    return {"setup": f"resnet50 ready pattern, {gbit} Gbit/s, {iterations} iterations, second half timed; "
                     "per event (post, finished, end_of_backward) including the sends it triggers; "
                     f"median over {repeats} interleaved repeats (range beside it)",
            "load_average_1min": [load, os.getloadavg()[0]], "per_scheduler": out}


def _replay(model, times, rate, settings, iterations) -> dict:
    clock, transport = ManualClock(), _NullTransport()
    scheduler = make_scheduler(settings, clock, transport)
    samples = []
    clock_ns = time.perf_counter_ns

    def call(method, arg):
        t0 = clock_ns()
        method(arg)
        samples.append(clock_ns() - t0)

    def drain(keep):
        while len(transport.in_flight) > keep:  # the link serves the oldest slice next
            piece = transport.in_flight.pop(0)
            clock.advance(piece.nbytes / rate)
            call(scheduler.finished, piece)

    sends_before = samples_before = 0
    for it in range(iterations):
        if it == iterations // 2:
            sends_before, samples_before = transport.sent, len(samples)
        for i in reversed(range(len(model.tensors))):
            clock.advance(times.bwd_s[i])
            spec = model.tensors[i]
            call(scheduler.post, Task(spec.name, i, spec.shape, iteration=it))
            drain(2)
        call(scheduler.end_of_backward, it)
        drain(0)
    steady = sorted(samples[samples_before:])  # the second half: Prophet has its plan by then
    n = len(steady)
    return {"events": n, "sends": transport.sent - sends_before,
            "median_us": statistics.median(steady) / 1e3, "p90_us": steady[int(0.9 * n)] / 1e3,
            "p99_us": steady[int(0.99 * n)] / 1e3, "mean_us": sum(steady) / n / 1e3}


def simulator_speed(repeats=3):
    """Wall seconds for 100 simulated iterations of ResNet-50 on 32 workers, schedulers interleaved."""
    model = get_model("resnet50")
    layers = layers_from(model, compute_times(model, 32))
    variants = {"fifo": Settings(scheduler="fifo"), "bytescheduler": Settings(scheduler="bytescheduler"),
                "prophet": Settings(scheduler="prophet"),
                "prophet_paper": Settings(scheduler="prophet", prophet_mode="paper")}
    runs = {name: [] for name in variants}
    for _ in range(repeats):
        for name, settings in variants.items():
            t0 = time.perf_counter()
            Simulation(layers, SimulatedCluster(workers=32, bandwidth=10 * GBIT), settings, 100).run()
            runs[name].append(time.perf_counter() - t0)
    times = {name: {"median_s": statistics.median(r), "min_s": min(r), "max_s": max(r)} for name, r in runs.items()}
    return {"setup": f"resnet50, 32 workers, ps, 10 Gbit/s, 100 iterations, {repeats} interleaved repeats",
            "load_average_1min": os.getloadavg()[0], "wall": times}


SCALE_WORKERS = (2, 8, 32, 128, 256)
SCALE_GBIT = (1, 10, 100)
# Scale effects on top of the engine: name -> what changes in the cluster at ``workers`` workers.
SCALE_CASES = {
    "homogeneous": lambda workers: {},
    "jitter_5pct": lambda workers: {"jitter": 0.05},
    "slow_worker_1.5x": lambda workers: {"slow_worker": 1.5},
    "servers_quarter": lambda workers: {"servers": max(1, workers // 4)},  # parameter server only
}
# --quick: the homogeneous case at a few workers and every bandwidth
QUICK_SCALE = {"cases": ("homogeneous",), "workers": (8, 256), "gbits": SCALE_GBIT}
# Every baseline at its best over its own knobs, each swept on the same engine as Prophet runs on:
# ByteScheduler's credit and partition together, DDP's bucket, Horovod's cycle time and fusion threshold
# (the last two all-reduce only).
BEST = {"ps": ("bytescheduler_swept",), "allreduce": ("bytescheduler_swept", "ddp_best", "horovod_best")}


def scale_cell(layers, cluster, iterations: int, warmup: int) -> dict:
    """One scale cell: Prophet (default settings, fused on all-reduce) and every baseline at its
    defaults and at the best of its sweep."""
    run = lambda settings: Simulation(layers, cluster, settings, iterations, warmup).run().iter_s  # noqa: E731
    (credit, partition), sweep, open_bs = best_bytescheduler(layers, cluster, iterations=iterations, warmup=warmup)
    default_partition = {c: t for (c, p), t in sweep.items() if p == Settings().partition and c in CREDIT_SWEEP}
    ms = {"bytescheduler": run(variant_settings("bytescheduler", Settings())),
          "bytescheduler_best": min(default_partition.values()),  # the credit alone, at the default partition
          "bytescheduler_swept": sweep[(credit, partition)],
          "prophet": run(variant_settings("prophet", Settings()))}
    knobs = {"best_credit": min(default_partition, key=default_partition.get),
             "best_credit_partition": [credit, partition],
             "open_edges": [f"bytescheduler {axis}" for axis in open_bs]}
    if cluster.arch == "allreduce":
        ms["ddp"] = simulate_baseline("ddp", layers, cluster, iterations, warmup).iter_s
        (knobs["best_bucket"],), buckets, open_ddp = best_bucket(layers, cluster, iterations, warmup)
        ms["ddp_best"] = buckets[(knobs["best_bucket"],)]
        ms["horovod"] = simulate_baseline("horovod", layers, cluster, iterations, warmup).iter_s
        (cycle, fusion), fusions, open_hvd = best_horovod(layers, cluster, iterations, warmup)
        ms["horovod_best"], knobs["best_horovod_cycle_fusion"] = fusions[(cycle, fusion)], [cycle, fusion]
        knobs["open_edges"] += [f"ddp {axis}" for axis in open_ddp] + [f"horovod {axis}" for axis in open_hvd]
    ms = {k: v * 1e3 for k, v in ms.items()}
    ratios = {f"prophet_vs_{name}": ms["prophet"] / ms[name] for name in ("bytescheduler", "bytescheduler_best")
              + BEST[cluster.arch]}
    return {**knobs, "iter_ms": ms, **ratios}


def scale_row(cell: tuple) -> dict:
    """One scale cell's row: (model, arch, case, workers, gbit, engine, iterations, warmup)."""
    m, arch, case, w, g, engine, iterations, warmup = cell
    spec = get_model(m)
    layers = layers_from(spec, compute_times(spec, spec.default_batch))
    # as many servers as workers unless the case says otherwise (the engine was calibrated on one)
    changes = {"servers": w if arch == "ps" else None, **SCALE_CASES[case](w)}
    cluster = SimulatedCluster(workers=w, arch=arch, bandwidth=g * GBIT, engine=engine, **changes)
    return {"model": m, "arch": arch, "case": case, "workers": w, "gbit": g,
            **scale_cell(layers, cluster, iterations, warmup)}


def scale_grid(engines: dict, iterations: int, models=("resnet50", "vgg16"), cases=tuple(SCALE_CASES),
               workers=SCALE_WORKERS, gbits=SCALE_GBIT, jobs: int = 1) -> dict:
    """Prophet against every baseline at its best (``BEST``) at 2 to 256 workers, with the calibrated
    engines' traits (``engines``: arch -> EngineTraits) and the scale effects of ``SCALE_CASES``; the
    cells in ``jobs`` processes (the simulation is deterministic: the rows do not depend on it)."""
    warmup = min(10, iterations // 3)
    cells = [(m, arch, case, w, g, engines[arch], iterations, warmup) for m in models for arch in engines
             for case in cases for w in workers for g in gbits
             if not (arch == "allreduce" and case == "servers_quarter")]
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            rows = list(tqdm(pool.map(scale_row, cells), total=len(cells), desc="scale"))
    else:
        rows = [scale_row(cell) for cell in tqdm(cells, desc="scale")]
    return {"setup": {"iterations": iterations, "warmup": warmup, "engines": {a: e.to_dict() for a, e in engines.items()},
                      "cases": list(cases), "workers": list(workers), "gbit": list(gbits), "models": list(models),
                      "sweeps": {"bytescheduler_credit": list(CREDIT_SWEEP),
                                 "bytescheduler_partition": list(PARTITION_SWEEP),
                                 "ddp_bucket_bytes": list(BUCKET_SWEEP), "horovod_cycle_s": list(CYCLE_SWEEP),
                                 "horovod_fusion_bytes": list(FUSION_SWEEP)},
                      "widening": f"each sweep above is the start: widened while its best sits at an edge, at "
                                  f"most {WIDENINGS} values past each edge, never past a knob's natural limit "
                                  f"(byteps_prophet/sim/sweeps.py)"},
            "cells": rows, "summary": summarize_scale(rows)}


def summarize_scale(rows) -> dict:
    """Prophet against each baseline at its defaults and at its best, by architecture and case, per
    worker count: the lowest and highest ratio of Prophet's iteration time to the baseline's over the
    cells (models and bandwidths; below 1: Prophet faster)."""
    summary = {}
    for case in SCALE_CASES:
        for arch in sorted({r["arch"] for r in rows}):
            sub = [r for r in rows if r["case"] == case and r["arch"] == arch]
            if not sub:
                continue
            keys = [k for k in sub[0] if k.startswith("prophet_vs_")]
            summary[f"{arch}/{case}"] = {
                str(w): {k: {"min": round(min(r[k] for r in cells), 4), "max": round(max(r[k] for r in cells), 4)}
                         for k in keys}
                for w in SCALE_WORKERS if (cells := [r for r in sub if r["workers"] == w])}
    return summary


PARTS = ("grid", "changing", "decision", "speed", "scale")
COLUMNS = ("fifo", "bytescheduler", "bytescheduler_best", "prophet", "prophet_paper")


def compact(result: dict) -> dict:
    """The results in a small committed form: one row per grid cell, iteration times in ms."""
    rows = [[c["model"], c["arch"], c["workers"], c["gbit"], round(c["lower_bound_ms"], 3),
             round(c.get("message_bound_ms", float("nan")), 3), c["best_credit"],
             *(round(c["iter_ms"][k], 3) if k in c["iter_ms"] else None for k in COLUMNS)]
            for c in result.get("grid", [])]
    return {"grid_setup": result.get("grid_setup"),
            "grid_columns": ["model", "arch", "workers", "gbit", "lower_bound_ms", "message_bound_ms",
                             "best_credit", *(f"{k}_ms" for k in COLUMNS)],
            "grid": rows, "summary": result.get("summary"),
            **{k: result[k] for k in ("changing_conditions", "decision_cost", "simulator_speed") if k in result},
            **({"scale": compact_scale(result["scale"])} if "scale" in result else {})}


SCALE_COLUMNS = ("bytescheduler", "bytescheduler_best", "bytescheduler_swept", "prophet", "ddp", "ddp_best", "horovod",
                 "horovod_best")
SCALE_KNOBS = ("best_credit", "best_credit_partition", "best_bucket", "best_horovod_cycle_fusion", "open_edges")


def compact_scale(scale: dict) -> dict:
    """The scale grid in its committed form: one row per cell, iteration times in ms (None: the
    baseline does not apply, DDP and Horovod on a parameter server)."""
    return {"setup": scale["setup"], "summary": scale["summary"],
            "columns": ["model", "arch", "case", "workers", "gbit", *SCALE_KNOBS, *(f"{k}_ms" for k in SCALE_COLUMNS)],
            "cells": [[r["model"], r["arch"], r["case"], r["workers"], r["gbit"], *(r.get(k) for k in SCALE_KNOBS),
                       *(round(r["iter_ms"][k], 3) if k in r["iter_ms"] else None for k in SCALE_COLUMNS)]
                      for r in scale["cells"]]}


def provenance() -> dict:
    """The commit the run started on and the command that ran it, recorded in what it writes."""
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                           cwd=Path(__file__).resolve().parent).stdout.strip()
    commit = (proc.stdout.strip() or "unknown") + ("+changes" if dirty else "")
    return {"commit": commit, "command": " ".join(["scripts/benchmarks/bench_sim.py", *sys.argv[1:]])}


def write_compact(path: str, data: dict) -> None:
    """A small committed copy: one JSON line per grid row, so diffs show the rows that moved."""
    text = json.dumps(data, indent=None, separators=(",", ":"))
    Path(path).write_text(text.replace("],[", "],\n[") + "\n")
    print(f"wrote {path}")


def summarize(grid) -> dict:
    ratios = [c["ratio_to_best_credit"]["prophet"] for c in grid]
    off = [c for c in grid if c["ratio_to_best_credit"]["bytescheduler"] > 1.02]
    summary = {
        "cells": len(grid),
        "prophet_within_1pct_of_best_credit": sum(r <= 1.01 for r in ratios),
        "prophet_vs_best_credit_median": statistics.median(ratios),
        "prophet_vs_best_credit_max": max(ratios),
        "cells_where_default_credit_is_2pct_off": len(off),
        "of_those_prophet_faster_than_default_credit": sum(
            c["iter_ms"]["prophet"] < c["iter_ms"]["bytescheduler"] for c in off),
        "cells_above_5pct_of_lower_bound_for_best_credit": sum(
            c["ratio_to_lower_bound"]["bytescheduler_best"] > 1.05 for c in grid),
        "cells_above_5pct_of_lower_bound_for_prophet": sum(
            c["ratio_to_lower_bound"]["prophet"] > 1.05 for c in grid),
        "cells_above_5pct_of_message_bound_for_best_credit": sum(
            c["ratio_to_message_bound"]["bytescheduler_best"] > 1.05 for c in grid if "ratio_to_message_bound" in c),
        "cells_above_5pct_of_message_bound_for_prophet": sum(
            c["ratio_to_message_bound"]["prophet"] > 1.05 for c in grid if "ratio_to_message_bound" in c),
    }
    for w in sorted({c["workers"] for c in grid}):
        sub = [c["ratio_to_best_credit"]["prophet"] for c in grid if c["workers"] == w]
        summary[f"workers_{w}"] = {"cells": len(sub), "within_1pct": sum(r <= 1.01 for r in sub), "worst": max(sub)}
    summary["misses"] = [f"{c['model']}/{c['arch']}/{c['workers']}w/{c['gbit']}G: {c['ratio_to_best_credit']['prophet']:.4f}"
                         for c in grid if c["ratio_to_best_credit"]["prophet"] > 1.01]
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/bench_sim.json")
    ap.add_argument("--quick", action="store_true",
                    help="the grid: resnet50 and vgg16, 8 workers only; the scale grid: the homogeneous case at "
                         "8 and 256 workers")
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--jobs", type=int, default=1, help="processes the scale grid's cells run in (default 1)")
    ap.add_argument("--workers", default="2,8,32", help="comma-separated worker counts of the grid")
    ap.add_argument("--compact", metavar="JSON", help="also write a compact copy (scripts/benchmarks/data/bench_sim_results.json)")
    ap.add_argument("--compact-scale", metavar="JSON",
                    help="also write the scale grid alone in its compact form (scripts/benchmarks/data/bench_sim_scale.json)")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help="comma-separated parts to run (grid, changing, decision, speed, scale); the others are "
                         "kept from an existing --out file, so the timed parts can run alone under a lock")
    ap.add_argument("--engine-ps", default="scripts/benchmarks/data/replay/engine_byteps.json", metavar="FILE",
                    help="engine profile of the scale part's parameter server (default: the calibrated BytePS, "
                         "scripts/benchmarks/data/replay/engine_byteps.json)")
    ap.add_argument("--engine-allreduce", default="scripts/benchmarks/data/replay/engine_gloo.json", metavar="FILE",
                    help="engine profile of the scale part's all-reduce (default: the calibrated gloo, "
                         "scripts/benchmarks/data/replay/engine_gloo.json)")
    args = ap.parse_args()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if parts == ["none"]:  # only rewrite --compact from --out
        parts = []
    elif not parts:
        parts = ["?"]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        print(f"--parts {','.join(bad) or repr(args.parts)} is unknown; valid: {', '.join(PARTS)} or none", file=sys.stderr)
        raise SystemExit(2)
    if args.jobs < 1:
        print(f"--jobs {args.jobs} is invalid; valid: a whole number of processes, 1 or more", file=sys.stderr)
        raise SystemExit(2)
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.exists() else {}
    if "grid" in parts:
        models = ("resnet50", "vgg16") if args.quick else MODELS
        workers = (8,) if args.quick else tuple(int(w) for w in args.workers.split(","))
        cells = [(m, a, w, g) for m in models for a in ("ps", "allreduce") for w in workers for g in (1, 3, 10, 25, 100)]
        grid = []
        layer_cache = {}
        for m, arch, w, g in tqdm(cells, desc="grid"):
            if m not in layer_cache:
                spec = get_model(m)
                layer_cache[m] = layers_from(spec, compute_times(spec, spec.default_batch))
            cell = grid_cell(layer_cache[m], SimulatedCluster(workers=w, arch=arch, bandwidth=g * GBIT), args.iterations)
            cell = {"model": m, "arch": arch, "workers": w, "gbit": g, **cell}
            add_message_bound(cell, layer_cache[m], SimulatedCluster(workers=w, arch=arch, bandwidth=g * GBIT))
            grid.append(cell)
        result["grid_setup"] = {"iterations": args.iterations, "warmup": min(10, args.iterations // 3),
                                "batch": "each model's default", "credit_sweep": list(CREDIT_SWEEP)}
        result["grid"] = grid
        result["summary"] = summarize(grid)
        print(json.dumps(result["summary"], indent=1))
    if "changing" in parts:
        result["changing_conditions"] = changing_conditions()
        print(json.dumps([{k: case[k] for k in ("model", "arch", "prophet_vs_best_static")}
                          for case in result["changing_conditions"]["cases"]]))
    if "decision" in parts:
        result["decision_cost"] = decision_cost()
        print(json.dumps(result["decision_cost"]["per_scheduler"]))
    if "speed" in parts:
        result["simulator_speed"] = simulator_speed()
        print(json.dumps(result["simulator_speed"]["wall"]))
    if "scale" in parts:
        engines = {"ps": load_engine(args.engine_ps), "allreduce": load_engine(args.engine_allreduce)}
        quick = QUICK_SCALE if args.quick else {}
        started = provenance()  # the code the run starts on
        result["scale"] = scale_grid(engines, args.iterations, **quick, jobs=args.jobs)
        result["scale"]["setup"].update(started)
        print(json.dumps(result["scale"]["summary"], indent=1))
    out.parent.mkdir(parents=True, exist_ok=True)
    if parts:
        out.write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")
    if args.compact:
        write_compact(args.compact, compact(result))
    if args.compact_scale:
        if "scale" not in result:
            print(f"--compact-scale: {args.out} holds no scale grid; valid: --parts with scale", file=sys.stderr)
            raise SystemExit(2)
        write_compact(args.compact_scale, compact_scale(result["scale"]))


if __name__ == "__main__":
    main()
