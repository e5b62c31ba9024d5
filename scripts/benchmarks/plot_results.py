#!/usr/bin/env python3
"""README's first plot, from committed data only: the simulator grid (scripts/benchmarks/data/bench_sim_results.json).

For every model, at 8 workers and 10 Gbit/s, throughput of each schedule relative to FIFO, on a
parameter server (left) and a ring all-reduce (right): ByteScheduler with its default credit and
with the best credit of a sweep (what a tuning run finds), Prophet's default mode (no tuning) and
the ICPP'21 paper rule. The grid is deterministic, so the plot is too.

    .venv/bin/python scripts/benchmarks/plot_results.py                      # writes docs/img/sim_speedup.png
    .venv/bin/python scripts/benchmarks/plot_results.py --data X.json --out Y.png --workers 32 --gbit 25
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERIES = (  # column in the grid, label
    ("bytescheduler_ms", "ByteScheduler, default credit"),
    ("bytescheduler_best_ms", "ByteScheduler, best credit of a sweep"),
    ("prophet_ms", "Prophet (default mode, no tuning)"),
    ("prophet_paper_ms", "Prophet, paper rule"),
)


def speedups(data: dict, arch: str, workers: int, gbit: float) -> tuple[list[str], dict[str, list[float]]]:
    """Models in grid order and, per series, FIFO's iteration time over the series' (x faster)."""
    col = {name: i for i, name in enumerate(data["grid_columns"])}
    rows = [r for r in data["grid"]
            if r[col["arch"]] == arch and r[col["workers"]] == workers and r[col["gbit"]] == gbit]
    if not rows:
        raise ValueError(f"no grid cell for {arch}, {workers} workers, {gbit:g} Gbit/s; "
                         f"valid workers: {sorted({r[col['workers']] for r in data['grid']})}, "
                         f"Gbit/s: {sorted({r[col['gbit']] for r in data['grid']})}")
    models = [r[col["model"]] for r in rows]
    return models, {key: [r[col["fifo_ms"]] / r[col[key]] for r in rows] for key, _ in SERIES}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(REPO / "scripts" / "benchmarks" / "data" / "bench_sim_results.json"))
    parser.add_argument("--out", default=str(REPO / "docs" / "img" / "sim_speedup.png"))
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--gbit", type=float, default=10)
    args = parser.parse_args(argv)
    try:
        data = json.loads(Path(args.data).read_text())
    except (OSError, ValueError) as err:
        print(f"plot_results.py: error: {args.data}: {err}", file=sys.stderr)
        return 2

    try:
        panels = [speedups(data, arch, args.workers, args.gbit) for arch in ("ps", "allreduce")]
    except ValueError as err:
        print(f"plot_results.py: error: {err}", file=sys.stderr)
        return 2

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), sharey=True)
    for ax, title, (models, values) in zip(axes, ("parameter server", "ring all-reduce"), panels):
        width = 0.8 / len(SERIES)
        for i, (key, label) in enumerate(SERIES):
            xs = [m + (i - (len(SERIES) - 1) / 2) * width for m in range(len(models))]
            ax.bar(xs, values[key], width, label=label)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(models)), [m.replace("_", "-") for m in models], fontsize=8)
        ax.set_title(f"{title}, {args.workers} workers, {args.gbit:g} Gbit/s", fontsize=9)
        ax.grid(axis="y", linewidth=0.3)
    axes[0].set_ylabel("throughput / FIFO's")
    lows = [v for ax in axes for bar in ax.patches for v in [bar.get_height()]]
    axes[0].set_ylim(min(0.9, min(lows) - 0.02), max(lows) + 0.05)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.suptitle("Simulated speed-up over FIFO (scripts/benchmarks/data/bench_sim_results.json)", fontsize=10)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=90)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
