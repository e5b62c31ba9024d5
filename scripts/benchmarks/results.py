#!/usr/bin/env python3
"""Every figure docs/RESULTS.md and README's Results section quote, computed from committed data.

The files read are declared below (``AB_FILES``, ``PREDICTIONS``, ``OTHER_FILES``), each with the commit
and command that produced it. Each table is rendered between ``<!-- results:NAME:start -->`` and
``<!-- results:NAME:end -->`` in the documents; the words a row uses ("win", "level", "not settled")
come from its interval (``verdict``), never from a hand.

    .venv/bin/python scripts/benchmarks/results.py --write   # rewrites the tables in the documents
    .venv/bin/python scripts/benchmarks/results.py --check   # exit 1 naming each table that differs
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from byteps_prophet.ab.stats import paired_ratios, speedup  # noqa: E402
from byteps_prophet.ab.report import LIMIT_DEFECT  # noqa: E402
from byteps_prophet.ab.stats import verdict as stats_verdict  # noqa: E402

DATA = REPO / "scripts" / "benchmarks" / "data"
README = REPO / "README.md"
RESULTS = REPO / "docs" / "RESULTS.md"
PREDICTION_TARGET = 0.10


class ABFile(NamedTuple):
    """One A/B measurement: ``byteps-prophet ab --json`` under key "ab" with "commit" and "command" beside
    it (or a replay recording's measured.json, which holds the same runs), and the pairs quoted from it:
    (variant, against, headline) where headline puts the pair in the opening table; ``note`` is added to
    its configuration (a default of its commit that differs from today's)."""
    path: str
    pairs: tuple[tuple[str, str, bool], ...]
    note: str = ""


# Prophet over ByteScheduler and over FIFO in the opening table, ByteScheduler over FIFO in its section
PAIRS3 = (("prophet", "bytescheduler", True), ("prophet", "fifo", True), ("bytescheduler", "fifo", False))

# One line a measurement; its table goes between <!-- results:ab-NAME:start --> and
# <!-- results:ab-NAME:end --> in docs/RESULTS.md (NAME: table_name(path); --check names a missing pair),
# then --write fills it. Headline pairs are measurements of today's code; the replay's recordings, taken
# at older commits with their defaults, stay in their sections.
AB_FILES = (
    ABFile("ab/overlap-torch-byteps-vgg-200mbit.json",
           (("prophet", "bytescheduler", False), ("prophet_overlap", "prophet", False),
            ("bytescheduler_overlap", "bytescheduler", False))),
    ABFile("ab/overlap-torch-gloo-vgg-1gbit.json",
           (("prophet", "bytescheduler", False), ("prophet_overlap", "prophet", False),
            ("bytescheduler_overlap", "bytescheduler", False))),
    ABFile("ab/ab-torch-byteps-vgg-200mbit-after.json", (("prophet", "bytescheduler", True),)),
    ABFile("ab/ab-torch-byteps-vgg-200mbit-before.json", (("prophet", "bytescheduler", False),),
           "before the redesign of issue 50"),
    # the prediction's measurement; its ByteScheduler and Prophet rounds are pooled with six more below
    ABFile("ab/ab-torch-byteps-vgg-500mbit.json",
           (("prophet", "bytescheduler", False), ("prophet", "fifo", False), ("bytescheduler", "fifo", False))),
    ABFile("ab/ab-torch-byteps-vgg-500mbit-pooled.json", PAIRS3),
    ABFile("ab/ab-torch-byteps-vgg-1gbit.json", PAIRS3),
    ABFile("ab/ab-torch-byteps-resnet-1gbit.json",
           (("prophet", "fifo", True), ("prophet", "bytescheduler", True), ("bytescheduler", "fifo", False))),
    ABFile("ab/ab-torch-gloo-vgg-1gbit.json", (("prophet", "bytescheduler", True),)),
    ABFile("ab/ab-torch-gloo-vgg-3w-500mbit.json", PAIRS3),
    ABFile("ab/ab-mxnet-byteps-transformer-200mbit.json", (("prophet", "bytescheduler", True),)),
    ABFile("ab/ab-mxnet-byteps-transformer-200mbit-cubic.json", (("prophet", "bytescheduler", True),)),
    # the prediction's measurement; pooled with six more rounds below
    ABFile("ab/ab-mxnet-byteps-resnet-500mbit.json",
           (("prophet", "bytescheduler", False), ("prophet", "fifo", False), ("bytescheduler", "fifo", False))),
    ABFile("ab/ab-mxnet-byteps-resnet-500mbit-pooled.json", PAIRS3),
    ABFile("ab/ab-mxnet-kvstore-transformer-300mbit.json", (("prophet", "bytescheduler", True),)),
    ABFile("ab/ab-mxnet-kvstore-transformer-500mbit.json", PAIRS3),
    ABFile("ab/ab-mxnet-kvstore-transformer-1gbit.json", (("prophet", "bytescheduler", True),)),
    ABFile("replay/torch_byteps_vgg_200m/measured.json",
           (("prophet", "bytescheduler", False), ("prophet", "fifo", False)), "overlap on"),
    ABFile("replay/torch_byteps_vgg_1g/measured.json",
           (("prophet", "bytescheduler", False), ("prophet", "fifo", False)), "overlap on"),
    ABFile("replay/torch_gloo_vgg_1g/measured.json",
           (("prophet", "bytescheduler", False), ("prophet", "fifo", False)), "overlap on"),
    ABFile("replay/mxnet_byteps_transformer_200m_bbr/measured.json",
           (("prophet", "bytescheduler", False), ("prophet", "fifo", False))),
    ABFile("replay/mxnet_byteps_transformer_200m/measured.json",
           (("prophet", "bytescheduler", False), ("prophet", "fifo", False))),
    ABFile("replay/mxnet_kvstore_transformer_300m/measured.json",
           (("prophet", "bytescheduler", False), ("prophet", "fifo", False))),
    ABFile("replay/mxnet_kvstore_transformer_1g/measured.json",
           (("prophet", "bytescheduler", False), ("prophet", "fifo", False))),
)

# Predictions committed before their measurement; each names the A/B file that measures it (absent
# until measured: the table then says "awaiting measurement").
PREDICTIONS = ("predictions/torch-byteps-vgg-500mbit.json", "predictions/mxnet-kvstore-transformer-500mbit.json",
               "predictions/torch-byteps-vgg-1gbit.json", "predictions/mxnet-byteps-resnet-500mbit.json",
               "predictions/torch-gloo-vgg-3w-500mbit.json")

class Recorded(NamedTuple):
    """A data file other than an A/B's, with the commit and command that produced it where the file
    does not hold them itself (None: it does)."""
    path: str
    commit: str | None
    command: str | None


OTHER_FILES = {
    "replay": Recorded("replay/results.json", None, "scripts/benchmarks/bench_replay.py --replay-only"),
    "sim": Recorded("bench_sim_results.json",
                    "grid and changing conditions (--parts grid,changing) at cfff8f3, decision cost and speed "
                    "(--parts decision,speed) at 0aff976, scale (--parts scale) at 36cd0d7",
                    "scripts/benchmarks/bench_sim.py --parts PARTS --out OUT; scripts/benchmarks/bench_sim.py "
                    "--parts none --out OUT --compact scripts/benchmarks/data/bench_sim_results.json"),
    "sim_scale": Recorded("bench_sim_scale.json", None, None),
    "baselines": Recorded("bench_baselines_results.json", "be8dadb",
                          "scripts/benchmarks/bench_baselines.py --out out/bench_baselines.json "
                          "--compact scripts/benchmarks/data/bench_baselines_results.json"),
    "gloo_2w": Recorded("fusion/engine_gloo_2w.json", "70986f1",
                        "byteps-prophet calibrate --backend gloo --workers 2 --bandwidth 1gbit"),
    "gloo_4w": Recorded("fusion/engine_gloo_4w.json", "70986f1",
                        "byteps-prophet calibrate --backend gloo --workers 4 --bandwidth 1gbit"),
    "stress": Recorded("stress-torch-200.json", None, None),
    "limit": Recorded("ab/limit-torch-byteps-vgg-200mbit.json", None, None),
}

NAMES = {"fifo": "FIFO", "bytescheduler": "ByteScheduler", "bytescheduler_tuned": "ByteScheduler (tuned credit)",
         "bytescheduler_overlap": "ByteScheduler with overlap", "prophet": "Prophet",
         "prophet_overlap": "Prophet with overlap", "prophet_paper": "Prophet (paper rule)"}
STACKS = {("torch", "byteps"): "torch/BytePS", ("torch", "gloo"): "torch/gloo",
          ("mxnet", "byteps"): "BytePS-MXNet", ("mxnet", "kvstore"): "MXNet KVStore"}


# -- reading ------------------------------------------------------------------------------------------
def declared_files() -> list[Path]:
    """Every data file this script reads (the test deletes none and checks each exists)."""
    paths = [f.path for f in AB_FILES] + list(PREDICTIONS) + [f.path for f in OTHER_FILES.values()]
    return [DATA / p for p in dict.fromkeys(paths)]


def load(path: str) -> dict:
    return json.loads((DATA / path).read_text())


def ab_measurement(path: str) -> dict:
    """An A/B file as {commit, command, config, tcp, runs, note}, from either layout."""
    doc = load(path)
    body = doc.get("ab", doc)
    note = next((f.note for f in AB_FILES if f.path == path), "")
    return {"commit": doc["commit"], "command": doc["command"], "config": body["config"],
            "tcp": body.get("tcp_congestion_control"), "runs": body["runs"], "note": note}


# -- the words of an interval ---------------------------------------------------------------------------
def pair_summary(runs: list[dict], a: str, b: str) -> dict:
    """The A/B's own summary of the pair ``a``/``b`` (``ab.stats.speedup``), from the rounds."""
    return speedup(paired_ratios(runs, a, b),
                   statistics.median(variant_rates(runs, a)) / statistics.median(variant_rates(runs, b)))


def word(s: dict) -> str:
    """What the pair may be called, by ab/stats.py's rule: win / loss only where its 95% interval lies
    above / below 1, level within 1 +- LEVEL_BAND, otherwise (and always with fewer than 6 rounds) not
    settled."""
    return stats_verdict(**s["interval"])


def verdict(s: dict) -> str:
    """The word and the rounds it rests on: "not settled (4 rounds)", "win (8 rounds)"."""
    return f"{word(s)} ({s['rounds']} rounds)"


def interval_text(s: dict) -> str:
    """The 95% interval of the median, or with fewer rounds their range (INTERVAL says which)."""
    return f"{s['interval']['low']:.3f}-{s['interval']['high']:.3f}"


INTERVAL = "95% interval, or range (< 6 rounds)"


def configuration(m: dict) -> str:
    c = m["config"]
    """Stack, model, batch, link and TCP; the worker count where it is not 2 (the documents' default)."""
    width = f" w{c['width']:g}" if c.get("width", 1.0) != 1.0 else ""
    workers = f", {c['workers']} workers" if c["workers"] != 2 else ""
    tcp = m["tcp"].upper() if m["tcp"] else "BBR"  # files before the A/B named it ran under the machine's BBR
    note = f", {m['note']}" if m.get("note") else ""
    return (f"{STACKS[c['framework'], c['backend']]} {c['model']}{width} b{c['batch']} {rate(c['bandwidth'])}"
            f"{workers}, {tcp}{note}")


def rate(text: str) -> str:
    return text.replace("gbit", " Gbit/s").replace("mbit", " Mbit/s")


def prose(text: str) -> str:
    """``text`` in lines of at most 120 characters (the documents' limit)."""
    return "\n".join(textwrap.wrap(text, 120, break_on_hyphens=False, break_long_words=False))


def item(text: str) -> str:
    """A list item in lines of at most 120 characters."""
    return "\n".join(textwrap.wrap(text, 120, initial_indent="- ", subsequent_indent="  ",
                                    break_on_hyphens=False, break_long_words=False))


def command_block(command: str) -> str:
    """A command as a shell block, continued over lines of at most 120 characters."""
    lines = textwrap.wrap(command, 110, break_on_hyphens=False, break_long_words=False)
    return "```\n" + " \\\n    ".join(lines) + "\n```"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# -- tables -------------------------------------------------------------------------------------------
def pair_row(m: dict, a: str, b: str) -> list[str]:
    s = pair_summary(m["runs"], a, b)
    return [f"{NAMES[a]} / {NAMES[b]}", f"{s['median']:.3f}x", interval_text(s), verdict(s)]


def headline_rows() -> tuple[list[list[str]], list[str]]:
    """The opening table's rows (each headline pair) and the data each comes from."""
    rows, sources = [], []
    for f in AB_FILES:
        m = ab_measurement(f.path)
        heads = [(a, b) for a, b, headline in f.pairs if headline]
        for a, b in heads:
            _, *figures = pair_row(m, a, b)
            over = NAMES[b] if a == "prophet" else f"{NAMES[a]} / {NAMES[b]}"
            rows.append([configuration(m), over, *figures])
        if heads:
            sources.append(item(f"{configuration(m)}: `{f.path}`, commit {m['commit'].split()[0]}"))
    return rows, sources


HEADER = ["configuration", "Prophet over", "speed-up", INTERVAL, "verdict"]


def summary_table() -> str:
    """RESULTS.md's opening table: each headline pair, with interval, rounds and the word it earns,
    then the predictions' status and where each row's data is."""
    rows, sources = headline_rows()
    predictions = []
    for path in PREDICTIONS:
        p = load(path)
        predictions.append(item(f"{p['configuration']}: {prediction_status(p)}"))
        sources.append(item(f"prediction: `{path}`, predicted at {p['commit']}"))
    return (table(HEADER, rows) + "\n\nPredictions made before their measurement (below):\n\n"
            + "\n".join(predictions) + "\n\nData, under `scripts/benchmarks/data/`:\n\n" + "\n".join(sources))


def readme_table() -> str:
    return table(HEADER, headline_rows()[0])


def measurement_head(m: dict) -> str:
    return prose(f"{configuration(m)}; commit {m['commit']}:") + "\n\n" + command_block(m["command"])


def variant_rates(runs: list[dict], variant: str) -> list[float]:
    """``variant``'s samples/s, one per round: the run the A/B reported first in each (the reporting
    worker's rank differs by backend), as ``paired_ratios`` pairs them."""
    by_round: dict[int, float] = {}
    for r in runs:
        if r["variant"] == variant:
            by_round.setdefault(r["round"], r["samples_per_s"])
    return [by_round[k] for k in sorted(by_round)]


def ab_table(path: str) -> str:
    """One measurement: each variant's samples/s over its rounds, then the pairs quoted from it."""
    m = ab_measurement(path)
    rows = []
    for v in dict.fromkeys(r["variant"] for r in m["runs"]):
        rates = variant_rates(m["runs"], v)
        rows.append([NAMES.get(v, v), f"{statistics.median(rates):.2f}", f"{min(rates):.2f}-{max(rates):.2f}",
                     str(len(rates))])
    variants = table(["variant", "samples/s (median)", "min-max", "rounds"], rows)
    pairs = next(f.pairs for f in AB_FILES if f.path == path)
    ratios = table(["pair", "median of per-round ratios", INTERVAL, "verdict"],
                   [pair_row(m, a, b) for a, b, _ in pairs])
    return f"{prose(f'`scripts/benchmarks/data/{path}`:')}\n{measurement_head(m)}\n\n{variants}\n\n{ratios}"


def measurement_of(p: dict) -> Path:
    return DATA / p["measurement_file"].removeprefix("scripts/benchmarks/data/")


def prediction_status(p: dict) -> str:
    if not measurement_of(p).is_file():
        return "awaiting measurement"
    rows = prediction_rows(p)
    hits = sum(abs(err) <= PREDICTION_TARGET for _, _, _, err in rows)
    return f"{hits} of {len(rows)} within {PREDICTION_TARGET:.0%}; {order_agreement(p)}"


def measured_of(p: dict) -> dict:
    return ab_measurement(str(measurement_of(p).relative_to(DATA)))


def prediction_rows(p: dict) -> list[tuple[str, float, float, float]]:
    """(scheduler, predicted samples/s, measured median samples/s, error of the prediction)."""
    m = measured_of(p)
    out = []
    for s, figures in p["predicted"].items():
        rates = variant_rates(m["runs"], s)
        measured = statistics.median(rates)
        out.append((s, figures["samples_per_s"], measured, figures["samples_per_s"] / measured - 1))
    return out


def order_agreement(p: dict) -> str:
    """Ordered as measured, where the measurement separates two schedulers (their 95% interval
    lies on one side of 1); pairs it does not separate are said as such."""
    m = measured_of(p)
    names = list(p["predicted"])
    separated, agree = 0, 0
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            said = word(pair_summary(m["runs"], a, b))
            if said not in ("win", "loss"):
                continue
            separated += 1
            predicted_faster = p["predicted"][a]["samples_per_s"] > p["predicted"][b]["samples_per_s"]
            agree += predicted_faster == (said == "win")
    pairs = len(names) * (len(names) - 1) // 2
    if not separated:
        return f"the measurement separates none of the {pairs} pairs"
    rest = f" ({pairs - separated} of {pairs} not separated)" if separated < pairs else ""
    return f"ordered as measured in {agree} of the {separated} pairs the measurement separates{rest}"


def prediction_table(path: str) -> str:
    p = load(path)
    head = (prose(f"`scripts/benchmarks/data/{path}`: {p['configuration']}, predicted at {p['commit']}:")
            + "\n\n" + command_block(p["command"]))
    header = ["scheduler", "predicted samples/s", "measured samples/s (median)", "error", "within 10%"]
    if not measurement_of(p).is_file():
        rows = [[NAMES[s], f"{f['samples_per_s']:.2f}", "awaiting measurement", "", ""]
                for s, f in p["predicted"].items()]
        tail = prose(f"To be measured into {p['measurement_file']} (not yet there) by:") + "\n\n" + command_block(p["measure_with"])
    else:
        m = measured_of(p)
        rows = [[NAMES[s], f"{pred:.2f}", f"{meas:.2f}", f"{err:+.1%}",
                 "hit" if abs(err) <= PREDICTION_TARGET else "miss"] for s, pred, meas, err in prediction_rows(p)]
        tail = prose(f"Measured at commit {m['commit']}: {prediction_status(p)} (target: every scheduler within "
                     f"{PREDICTION_TARGET:.0%} and ordered as measured).") + "\n\n" + command_block(m["command"])
    return f"{head}\n\n{table(header, rows)}\n\n{tail}"


def replay_table() -> str:
    """The replay: each recording run again through the simulator with its own recorded compute (and,
    for BytePS-MXNet, its own recorded skew at every step): a fit of the model to the run, not a
    prediction. Error of the step time, the median over a variant's rounds."""
    path, _, command = OTHER_FILES["replay"]
    doc = load(path)
    rows = []
    for name, c in doc["configs"].items():
        m = ab_measurement(f"replay/{name}/measured.json")
        rounds = max(v["rounds"] for v in c["variants"].values())
        cells = [f"{c['variants'][s]['error']:+.1%}" for s in ("fifo", "bytescheduler", "prophet")]
        rows.append([f"{configuration(m)} ({rounds})", *cells, "yes" if c["order_agrees"] else "no"])
    header = ["recording (rounds)", "FIFO", "ByteScheduler", "Prophet", "ordered as measured"]
    return (prose(f"`scripts/benchmarks/data/{path}`, fitted at {doc['commit']} (compute: {doc['compute']}, "
                  f"skews: {doc['skews']}):") + "\n\n" + command_block(command) + "\n\n" + table(header, rows))


def sim_grid_table() -> str:
    path, commit, command = OTHER_FILES["sim"]
    d = load(path)
    col = {n: i for i, n in enumerate(d["grid_columns"])}
    grid = d["grid"]
    best = [r[col["prophet_ms"]] / r[col["bytescheduler_best_ms"]] for r in grid]
    paper = [r[col["prophet_paper_ms"]] / r[col["bytescheduler_best_ms"]] for r in grid]
    off = [r for r in grid if r[col["bytescheduler_ms"]] / r[col["bytescheduler_best_ms"]] > 1.02]
    faster = sum(r[col["prophet_ms"]] < r[col["bytescheduler_ms"]] for r in off)
    decision = d["decision_cost"]["per_scheduler"]
    speed = d["simulator_speed"]["wall"]
    rows = [
        ["Prophet / best credit of a sweep, per cell", f"{len(grid)} cells: {sum(x <= 1.01 for x in best)} within 1%, "
         f"median {statistics.median(best):.3f}, worst {max(best):.4f}"],
        ["paper rule / best credit", f"median {statistics.median(paper):.3f}, worst {max(paper):.3f}"],
        ["cells where the default credit is > 2% off the best", f"{len(off)}; Prophet faster than the default "
         f"credit in {faster}"],
        *([f"changing conditions, {c['model']} {c['arch']}: Prophet / best static credit",
           f"{c['prophet_vs_best_static']:.3f}"] for c in d["changing_conditions"]["cases"]),
        ["decision cost per event, median (us)", ", ".join(f"{NAMES.get(k, k)} {v['median_us']:.1f}"
                                                           for k, v in decision.items())],
        ["simulator wall time, 100 iterations (s)", ", ".join(f"{NAMES.get(k, k)} {v['median_s']:.2f}"
                                                               for k, v in speed.items())],
    ]
    return (prose(f"`scripts/benchmarks/data/{path}`: {commit}:") + "\n\n" + command_block(command)
            + "\n\n" + table(["figure", "simulated"], rows))


def sim_headline() -> str:
    """One sentence on the simulator's grid, for README and RESULTS.md."""
    d = load(OTHER_FILES["sim"].path)
    col = {n: i for i, n in enumerate(d["grid_columns"])}
    grid = d["grid"]
    best = [r[col["prophet_ms"]] / r[col["bytescheduler_best_ms"]] for r in grid]
    paper = [r[col["prophet_paper_ms"]] / r[col["bytescheduler_best_ms"]] for r in grid]
    models, workers, gbit = ({r[col[k]] for r in grid} for k in ("model", "workers", "gbit"))
    return prose(
        f"In the simulator's grid ({len(grid)} cells: {len(models)} models, {min(gbit):g}-{max(gbit):g} Gbit/s, "
        f"{min(workers)}-{max(workers)} workers, parameter server and all-reduce, an ideal engine), Prophet with "
        f"no tuning is within 1% of ByteScheduler's best credit of a sweep in {sum(x <= 1.01 for x in best)} "
        f"cells (its iteration time at most {max(best):.3f}x the best credit's); the ICPP'21 paper's rule "
        f"{statistics.median(paper):.3f}x on the median cell and {max(paper):.3f}x in the worst. "
        + scale_sentence())


def scale_sentence() -> str:
    """What the calibrated scale grid says against each baseline at the best of its own sweep."""
    d = load(OTHER_FILES["sim_scale"].path)
    col = {n: i for i, n in enumerate(d["columns"])}

    def ratios(arch, key, workers=None):
        return [r[col["prophet_ms"]] / r[col[key]] for r in d["cells"] if r[col["arch"]] == arch
                and r[col[key]] is not None and (workers is None or r[col["workers"]] in workers)]
    ps = ratios("ps", "bytescheduler_swept_ms")
    few, many = (2, 8, 32), (128, 256)
    ddp_few, ddp_many = ratios("allreduce", "ddp_best_ms", few), ratios("allreduce", "ddp_best_ms", many)
    return (f"With calibrated engines at 2-256 workers, against each baseline at the best of its own sweep: on "
            f"the parameter server Prophet / ByteScheduler (credit and partition swept) is {min(ps):.3f}-"
            f"{max(ps):.3f}x in iteration time ({sum(x > 1.02 for x in ps)} of {len(ps)} cells more than 2% "
            f"slower); on all-reduce Prophet / DDP's best bucket is {min(ddp_few):.3f}-{max(ddp_few):.3f}x at "
            f"2-32 workers and {min(ddp_many):.3f}-{max(ddp_many):.3f}x at 128-256 (docs/RESULTS.md, "
            f"\"Simulator\").")


def sim_scale_table() -> str:
    """The scale grid: Prophet against every baseline at the best of its own sweep, on the same engine."""
    path = OTHER_FILES["sim_scale"].path
    d = load(path)
    col = {n: i for i, n in enumerate(d["columns"])}
    against = (("bytescheduler_swept_ms", "ByteScheduler (credit x partition)"), ("ddp_best_ms", "DDP (bucket)"),
               ("horovod_best_ms", "Horovod (cycle x fusion)"))
    rows = []
    for arch, case in dict.fromkeys((r[col["arch"]], r[col["case"]]) for r in d["cells"]):
        cells = [r for r in d["cells"] if r[col["arch"]] == arch and r[col["case"]] == case]
        for key, name in against:
            ratios = [r[col["prophet_ms"]] / r[col[key]] for r in cells if r[col[key]] is not None]
            if ratios:
                slower = sum(x > 1.02 for x in ratios)
                rows.append([f"{case} ({arch})", name, str(len(ratios)), f"{min(ratios):.3f}-{max(ratios):.3f}",
                             f"{statistics.median(ratios):.3f}", str(slower)])
    header = ["case (arch)", "Prophet over the best of", "cells", "lowest-highest", "median", "> 2% slower"]
    setup = d["setup"]
    return (prose(f"`scripts/benchmarks/data/{path}`, at {setup['commit']}:") + "\n\n" + command_block(setup["command"])
            + "\n\n" + table(header, rows) + "\n\n" + prose(open_edges_sentence(d, col)))


def open_edges_sentence(d: dict, col: dict) -> str:
    """How many cells' best knobs still sit on an edge their widened sweep could have passed
    (bench_sim.py's ``open_edges``): there the baseline may do better than shown."""
    counts: dict[str, int] = {}
    for r in d["cells"]:
        for knob in r[col["open_edges"]] or []:
            counts[knob] = counts.get(knob, 0) + 1
    start = ("Each baseline's sweep starts from the grid in the file's setup and is widened while its best sits "
             "at an edge (byteps_prophet/sim/sweeps.py); ")
    if not counts:
        return start + f"in none of the {len(d['cells'])} cells does a best knob still sit on an edge it could pass."
    listed = ", ".join(f"{knob} in {n}" for knob, n in sorted(counts.items()))
    return (start + f"a best knob still sits on an edge it could pass ({listed} of {len(d['cells'])} cells): "
            "there the baseline may do better than shown, and Prophet's lead may be smaller.")


def baselines_table() -> str:
    path, commit, command = OTHER_FILES["baselines"]
    d = load(path)
    col = {n: i for i, n in enumerate(d["columns"])}
    vs = [r[col["prophet_vs_best_baseline"]] for r in d["grid"]]
    ddp = sum(r[col["prophet_ms"]] <= r[col["ddp_ms"]] for r in d["grid"])
    faster = sum(x < 0.999 for x in vs)
    rows = [["Prophet within 1% of the better of DDP (best bucket) and Horovod",
             f"{sum(x <= 1.01 for x in vs)} of {len(vs)}"],
            ["Prophet / that baseline", f"worst {max(vs):.3f}, best {min(vs):.3f}"],
            ["Prophet more than 0.1% faster than that baseline", f"{faster} of {len(vs)}"],
            ["Prophet at least as fast as DDP's default bucket", f"{ddp} of {len(vs)}"]]
    return (prose(f"`scripts/benchmarks/data/{path}`, at {commit}:") + "\n\n" + command_block(command)
            + "\n\n" + table(["figure", "simulated, all-reduce"], rows))


def engines_table() -> str:
    rows, commands = [], []
    for key in ("gloo_2w", "gloo_4w"):
        path, commit, command = OTHER_FILES[key]
        d = load(path)
        t = d["traits"]
        rows.append([f"`{path}`", str(d["measured"]["setup"]["workers"]), f"{t['message_cost_s'] * 1e3:.2f}",
                     f"{t['bandwidth_bytes_per_s'] / 1e6:.1f}", commit])
        commands.append(command)
    return (table(["engine file", "workers", "per-message cost (ms)", "rate (MB/s)", "commit"], rows)
            + "\n\n```\n" + "\n".join(commands) + "\n```")


def stress_table() -> str:
    path = OTHER_FILES["stress"].path
    d = load(path)
    rows = []
    for s in dict.fromkeys(r["scheduler"] for r in d["runs"]):
        runs = [r for r in d["runs"] if r["scheduler"] == s]
        rows.append([NAMES[s], str(len(runs)), str(sum(r["matched"] for r in runs)),
                     ", ".join(str(t) for t in sorted({r["engine_threads"] for r in runs}))])
    head = prose(f"`scripts/benchmarks/data/{path}`: {d['commit']}:") + "\n\n" + command_block(" ".join(d["command"]))
    return f"{head}\n\n{table(['scheduler', 'runs', 'matched the reference', 'engine threads'], rows)}"


def limit_table() -> str:
    """The A/B's limit on a run with both bounds measured: each bound, the limit (the lower), every
    variant's share of it, and any ``limit defect`` the tool reported (a variant above a bound)."""
    path = OTHER_FILES["limit"].path
    m = ab_measurement(path)
    body = load(path)["ab"]
    bound, results = body["limit"], body["results"]
    rows = [["compute alone (compute_only, median)", f"{bound['compute_samples_per_s']:.2f}", "bound"],
            ["busiest link's bytes at the shaped rate", f"{bound['link_samples_per_s']:.2f}", "bound"],
            ["**the limit** (the lower)", f"{bound['samples_per_s']:.2f}", ""]]
    for name, res in results.items():
        if name == "compute_only":
            continue
        share = res["samples_per_s"] / bound["samples_per_s"]
        rows.append([NAMES.get(name, name), f"{res['samples_per_s']:.2f}",
                     "reference, no bound" if name == "comm_only" else f"{share:.0%} of the limit"])
    defects = [w for w in body.get("warnings", []) if w.startswith(LIMIT_DEFECT)]
    tail = ("Defects the tool reported: " + "; ".join(defects)) if defects else "No variant above the limit."
    return (prose(f"`scripts/benchmarks/data/{path}`:") + "\n" + measurement_head(m) + "\n\n"
            + table(["", "samples/s", ""], rows) + "\n\n" + prose(tail))


def tables() -> dict[str, tuple[tuple[Path, ...], str]]:
    """Every generated table: name -> (the documents that hold it, Markdown)."""
    out = {"summary": ((RESULTS,), summary_table()), "readme": ((README,), readme_table()),
           "sim-headline": ((README, RESULTS), sim_headline()),
           "replay": ((RESULTS,), replay_table()), "sim-grid": ((RESULTS,), sim_grid_table()),
           "sim-scale": ((RESULTS,), sim_scale_table()), "baselines": ((RESULTS,), baselines_table()),
           "engines": ((RESULTS,), engines_table()), "stress": ((RESULTS,), stress_table()),
           "limit": ((RESULTS,), limit_table())}
    for f in AB_FILES:
        out[f"ab-{table_name(f.path)}"] = ((RESULTS,), ab_table(f.path))
    for path in PREDICTIONS:
        out[f"prediction-{table_name(path)}"] = ((RESULTS,), prediction_table(path))
    return out


def table_name(path: str) -> str:
    """A data file's table name: its path under data/ without the extension (and without ab/,
    predictions/, /measured), "/" and "_" as "-"."""
    stem = path.rsplit(".", 1)[0].removeprefix("ab/").removeprefix("predictions/").removesuffix("/measured")
    return stem.removeprefix("ab-").replace("/", "-").replace("_", "-")


# -- the documents --------------------------------------------------------------------------------------
def markers(name: str) -> tuple[str, str]:
    return f"<!-- results:{name}:start -->", f"<!-- results:{name}:end -->"


def replaced(text: str, name: str, body: str) -> str | None:
    """``text`` with the region of ``name`` holding ``body``; None when its markers are missing."""
    start, end = markers(name)
    i, j = text.find(start), text.find(end)
    if i < 0 or j < i:
        return None
    return text[: i + len(start)] + "\n" + body + "\n" + text[j:]


def shown(doc: Path) -> str:
    """A document's path as the messages name it: from the repository's root."""
    return os.path.relpath(doc, REPO)


def differences(rewrite: bool = False) -> list[str]:
    """The tables whose region in their document differs from what the data gives, or is missing; with
    ``rewrite`` the differing regions are written anew and only the missing ones are returned."""
    out = []
    for name, (docs, body) in tables().items():
        for doc in docs:
            text = doc.read_text()
            new = replaced(text, name, body)
            if new is None:
                out.append(f"{name}: no {markers(name)[0]} ... {markers(name)[1]} in {shown(doc)}")
            elif new != text and rewrite:
                doc.write_text(new)
            elif new != text:
                out.append(f"{name}: {shown(doc)} differs from what the data gives")
    return out


def write() -> list[str]:
    return differences(rewrite=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite every generated table in the documents")
    mode.add_argument("--check", action="store_true", help="exit 1 naming each table that differs")
    args = ap.parse_args(argv)
    missing = [f"scripts/benchmarks/data/{path.relative_to(DATA)} is missing (declared in results.py)"
               for path in declared_files() if not path.is_file()]
    problems = missing or (write() if args.write else differences())
    for line in problems:
        print(f"results.py: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
