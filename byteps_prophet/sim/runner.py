"""Run the schedulers side by side on one simulated cluster: what ``simulate`` and the benchmark call.

Results are keyed as the CLI's JSON reports them:

* ``fifo``;
* ``bytescheduler`` (the default credit) and ``bytescheduler_best`` (the best credit of a sweep over
  ``CREDIT_SWEEP``: a fair A/B gives ByteScheduler its best credit, docs/ALGORITHMS.md section 2);
* ``prophet`` (default, work-conserving mode) and ``prophet_paper`` (section 3 exactly);
* baselines that are not schedulers (``sim/baseline_runs.py``), all-reduce's: ``ddp`` and ``ddp_best``
  (the best bucket of a sweep), ``horovod`` and ``horovod_best`` (the best cycle time and fusion
  threshold of a sweep). ``all`` takes them on all-reduce (``parse_schedulers``).

``best_bytescheduler`` sweeps ByteScheduler's credit and partition together, widened past the grid's
edges (sim/sweeps.py; the scale grid's fair ByteScheduler); ``bytescheduler_best`` keeps the default
partition and ``CREDIT_SWEEP`` as it is.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from byteps_prophet.core import Settings
from byteps_prophet.core.trace import TraceLog
from byteps_prophet.errors import UserError
from byteps_prophet.sim.baseline_runs import BASELINE_VARIANTS, best_bucket, best_horovod, simulate_baseline
from byteps_prophet.sim.simulation import Layer, SimResult, SimulatedCluster, lower_bound_s, simulate
from byteps_prophet.sim.sweeps import Axis, Sweep, widened_sweep

SCHEDULER_CHOICES = ("fifo", "bytescheduler", "prophet")
# Each choice reports its variants: the default-credit ByteScheduler beside the best credit, and the
# paper's Prophet beside the default.
VARIANTS = {
    "fifo": ("fifo",),
    "bytescheduler": ("bytescheduler", "bytescheduler_best"),
    "prophet": ("prophet", "prophet_paper"),
}
CREDIT_SWEEP = tuple(250_000 * 2**k for k in range(10))  # 0.25M .. 128M elements
PARTITION_SWEEP = tuple(250_000 * 2**k for k in range(6))  # 0.25M .. 8M elements (the default 1M among them)
VARIANTS.update(BASELINE_VARIANTS)  # what a torch user runs instead, on all-reduce
BASELINE_CHOICES = tuple(BASELINE_VARIANTS)


@dataclass
class Comparison:
    lower_bound_s: float
    compute_s: float
    results: dict[str, SimResult] = field(default_factory=dict)
    best_credit: int | None = None
    sweep: dict[int, float] = field(default_factory=dict)  # credit -> iteration seconds
    best_bucket: int | None = None  # ddp_best's bucket, bytes
    bucket_sweep: dict[int, float] = field(default_factory=dict)  # bucket bytes -> iteration seconds
    best_horovod: tuple[float, int] | None = None  # horovod_best's (cycle seconds, fusion bytes)
    horovod_sweep: dict[tuple[float, int], float] = field(default_factory=dict)  # -> iteration seconds
    open_edges: dict[str, tuple[str, ...]] = field(default_factory=dict)  # variant -> its sweep's open edges


def all_choices(arch: str) -> tuple[str, ...]:
    """What ``all`` means: the schedulers, and on all-reduce the baselines (DDP and Horovod are
    all-reduce; a parameter server has no such baseline)."""
    return SCHEDULER_CHOICES + (BASELINE_CHOICES if arch == "allreduce" else ())


def parse_schedulers(text: str, arch: str = "ps") -> list[str]:
    everything = all_choices(arch)
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    names = list(dict.fromkeys(m for n in names for m in (everything if n == "all" else (n,))))
    bad = [n for n in names if n not in VARIANTS]
    if bad or not names:
        raise UserError(f"scheduler {', '.join(bad) or repr(text)} is unknown; valid: "
                        f"{', '.join(VARIANTS)} (comma-separated; all = {', '.join(SCHEDULER_CHOICES)}, "
                        f"and {', '.join(BASELINE_CHOICES)} on all-reduce)")
    return names


def variant_settings(name: str, base: Settings) -> Settings:
    return {
        "fifo": base.replace(scheduler="fifo"),
        "bytescheduler": base.replace(scheduler="bytescheduler", credit_tuning=False),
        "prophet": base.replace(scheduler="prophet", prophet_mode="default"),
        "prophet_paper": base.replace(scheduler="prophet", prophet_mode="paper"),
    }[name]


def compare(layers: Sequence[Layer], cluster: SimulatedCluster, schedulers: Iterable[str],
            base: Settings = Settings(), iterations: int = 30, warmup: int = 10,
            trace_iteration: int | None = None, progress: Callable[[str], None] | None = None,
            synchronised: bool = False) -> Comparison:
    """Simulate each requested scheduler (with its variants) on the same cluster and model; timed as
    the benchmarks do where ``synchronised`` (``Simulation``)."""
    tick = progress or (lambda label: None)
    comparison = Comparison(lower_bound_s(layers, cluster),
                            sum(layer.fwd_s + layer.bwd_s for layer in layers))

    def run(settings: Settings, trace: bool = True) -> SimResult:
        return simulate(layers, cluster, settings, iterations, warmup, trace_iteration if trace else None,
                        synchronised)

    for choice in schedulers:
        for name in VARIANTS[choice]:
            tick(name)
            if name in ("ddp", "ddp_best", "horovod", "horovod_best"):
                knobs = best_baseline_knobs(comparison, name, layers, cluster, iterations, warmup, synchronised)
                comparison.results[name] = simulate_baseline(name, layers, cluster, iterations, warmup,
                                                             trace_iteration, synchronised, **knobs)
                continue
            if name == "bytescheduler_best":
                for credit in CREDIT_SWEEP:
                    comparison.sweep[credit] = run(variant_settings("bytescheduler", base).replace(credit=credit),
                                                   trace=False).iter_s
                comparison.best_credit = min(comparison.sweep, key=comparison.sweep.get)
                settings = variant_settings("bytescheduler", base).replace(credit=comparison.best_credit)
            else:
                settings = variant_settings(name, base)
            comparison.results[name] = run(settings)
    return comparison


def best_baseline_knobs(comparison: Comparison, name: str, layers: Sequence[Layer], cluster: SimulatedCluster,
                        iterations: int, warmup: int, synchronised: bool) -> dict:
    """The knobs ``name`` runs with: none for a baseline's defaults; for ``ddp_best`` and ``horovod_best``
    the best of their sweeps, kept in ``comparison`` with the sweep and its open edges."""
    if name == "ddp_best":
        (comparison.best_bucket,), buckets, comparison.open_edges[name] = best_bucket(
            layers, cluster, iterations, warmup, synchronised=synchronised)
        comparison.bucket_sweep = {bucket: t for (bucket,), t in buckets.items()}
        return {"bucket_bytes": comparison.best_bucket}
    if name == "horovod_best":
        comparison.best_horovod, comparison.horovod_sweep, comparison.open_edges[name] = best_horovod(
            layers, cluster, iterations, warmup, synchronised=synchronised)
        cycle, fusion = comparison.best_horovod
        return {"cycle_s": cycle, "fusion_bytes": fusion}
    return {}


def best_bytescheduler(layers: Sequence[Layer], cluster: SimulatedCluster, base: Settings = Settings(),
                       iterations: int = 30, warmup: int = 10, credits: Sequence[int] = CREDIT_SWEEP,
                       partitions: Sequence[int] = PARTITION_SWEEP, synchronised: bool = False) -> Sweep:
    """ByteScheduler's fastest (credit, partition): ``credits`` x ``partitions`` widened while the best
    sits at an edge (sim/sweeps.py), the credit up to the whole model, the partition up to the largest
    tensor (past either, nothing changes)."""
    settings = variant_settings("bytescheduler", base)
    sizes = [layer.elements for layer in layers]

    def time_of(credit: int, partition: int) -> float:
        return simulate(layers, cluster, settings.replace(credit=credit, partition=partition), iterations, warmup,
                        None, synchronised).iter_s
    return widened_sweep(time_of, [Axis("credit", tuple(credits), lowest=1, highest=sum(sizes)),
                                   Axis("partition", tuple(partitions), lowest=1, highest=max(sizes))])


def report(comparison: Comparison, **header) -> dict:
    """The JSON object ``simulate --json`` prints."""
    bound = comparison.lower_bound_s
    results = {}
    for name, result in comparison.results.items():
        entry = {"iter_ms": round(result.iter_s * 1e3, 4),
                 "ratio_to_lower_bound": round(result.iter_s / bound, 4)}
        if result.window is not None:  # timed as the benchmarks: each step as their profiles count it
            entry["steps_ms"] = [round(step * 1e3, 4) for step in result.timed_steps_s]
        if name == "bytescheduler_best":
            entry["credit"] = comparison.best_credit
        if name == "ddp_best":
            entry["bucket_bytes"] = comparison.best_bucket
        if name == "horovod_best":
            entry["cycle_s"], entry["fusion_bytes"] = comparison.best_horovod
        if comparison.open_edges.get(name):  # the best may lie past these knobs' widest values tried
            entry["open_edges"] = list(comparison.open_edges[name])
        results[name] = entry
    out = dict(header)
    out["lower_bound_ms"] = round(bound * 1e3, 4)
    out["compute_ms"] = round(comparison.compute_s * 1e3, 4)
    out["results"] = results
    if comparison.sweep:
        out["credit_sweep_ms"] = {str(c): round(t * 1e3, 4) for c, t in comparison.sweep.items()}
    if comparison.bucket_sweep:
        out["bucket_sweep_ms"] = {str(b): round(t * 1e3, 4) for b, t in comparison.bucket_sweep.items()}
    if comparison.horovod_sweep:
        out["horovod_sweep_ms"] = {f"{c * 1e3:g}ms/{f}": round(t * 1e3, 4)
                                   for (c, f), t in comparison.horovod_sweep.items()}
    return out


def chrome_trace(comparison: Comparison) -> dict:
    """The plugins' trace format (core/trace.py), one process per scheduler: a compute row, and one row
    per gradient with its queueing (ready -> first byte sent) and communication spans of the traced
    iteration."""
    events: list[dict] = []
    for pid, (name, result) in enumerate(comparison.results.items()):
        log = result.trace
        if log is None:
            continue
        trace = TraceLog(pid, name)
        origin = min([s for _, s, _ in log.compute] + list(log.ready.values()) or [0.0])
        for what, start, end in log.compute:
            trace.span("compute", what, start - origin, end - origin, track="compute")
        first_start: dict[int, float] = {}
        for index, key, start, finish in log.pieces:
            first_start[index] = min(first_start.get(index, math.inf), start)
            trace.span("comm", key, start - origin, finish - origin, track=f"grad {index}")
        for index, ready in log.ready.items():
            if index in first_start and first_start[index] > ready:
                trace.span("queue", "queued", ready - origin, first_start[index] - origin, track=f"grad {index}")
        events += trace.document()["traceEvents"]
    return {"traceEvents": events, "displayTimeUnit": "ms", "metadata": {"simulated": list(comparison.results)}}


def write_trace(comparison: Comparison, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(chrome_trace(comparison), f)


def plot(comparison: Comparison, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(comparison.results)
    times = [comparison.results[n].iter_s * 1e3 for n in names]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    bars = ax.bar(names, times, color=["#888" if "fifo" in n else "#4a7ebb" if "byte" in n else "#d9822b"
                                       for n in names])
    ax.axhline(comparison.lower_bound_s * 1e3, color="k", linestyle="--", linewidth=1, label="lower bound")
    for bar, t in zip(bars, times):
        ax.annotate(f"{t:.1f}", (bar.get_x() + bar.get_width() / 2, t), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("iteration time (ms)")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    plt.setp(ax.get_xticklabels(), rotation=15, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
