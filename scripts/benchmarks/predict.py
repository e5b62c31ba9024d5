#!/usr/bin/env python3
"""Commit a prediction before its measurement: run the simulator on one recorded FIFO profile and a
calibrated engine for a configuration none of them was taken at, and write what it predicts, with the
commit, the command and the A/B that will measure it, to scripts/benchmarks/data/predictions/NAME.json
(results.py's prediction table reads it, "awaiting measurement" until the A/B's file exists).

The link is the engine's measured share of its shaped rate applied to --bandwidth, as a replay's
(bench_replay.py ``link_args``); the compute is the profile's median iteration at every step
(``--compute median``) and no skew is given, so nothing of the measured configuration goes in.

    scripts/benchmarks/predict.py torch-gloo-vgg-3w-500mbit \\
        --profile scripts/benchmarks/data/predictions/profiles/torch_gloo_vgg_3w_1g.profile.json \\
        --engine gloo --arch allreduce --workers 3 --bandwidth 500mbit --steps 6 --warmup 3 \\
        --configuration "torch/gloo vgg b16, 500 Mbit/s, 3 workers, BBR" \\
        --measure-with "byteps-prophet ab --framework torch --backend gloo ... --json"
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_replay import OUT as REPLAY, ROOT, git_commit, link_args  # noqa: E402

from byteps_prophet.cluster.cli import parse_env  # noqa: E402
from byteps_prophet.errors import ConfigError  # noqa: E402

PREDICTIONS = HERE / "data" / "predictions"
VARIANTS = ("fifo", "bytescheduler", "prophet")
TARGET = 0.10


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help="the prediction's file name, without .json")
    p.add_argument("--profile", required=True, help="a recorded FIFO profile (ab --record)")
    p.add_argument("--engine", required=True, choices=("byteps", "byteps_cubic", "gloo", "kvstore"),
                   help="the calibrated engine under scripts/benchmarks/data/replay/")
    p.add_argument("--arch", required=True, choices=("ps", "allreduce"))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--bandwidth", required=True, help="the shaped rate predicted at, tc units")
    p.add_argument("--steps", type=int, required=True, help="timed steps, as the A/B will time them")
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="a setting the plugin under test runs with (repeatable)")
    p.add_argument("--configuration", required=True, help="what is predicted, in words")
    p.add_argument("--inputs", required=True, help="where the profile and the engine come from, in words")
    p.add_argument("--measure-with", required=True, help="the A/B command that will measure it")
    return p.parse_args(argv)


def simulate_argv(args: argparse.Namespace) -> list[str]:
    profile = os.path.relpath(Path(args.profile).resolve(), ROOT)
    link = link_args(REPLAY / f"engine_{args.engine}.json", args.bandwidth, True, args.arch, args.workers)
    arch = ["--arch", "ps", "--servers", "1"] if args.arch == "ps" else ["--arch", "allreduce"]
    return ["simulate", "--profile", profile, "--compute", "median", "--workers", str(args.workers), *arch,
            *link, "--scheduler", ",".join(VARIANTS), "--steps", str(args.steps), "--warmup", str(args.warmup),
            "--json"]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = PREDICTIONS / f"{args.name}.json"
    if out.exists():
        raise SystemExit(f"predict: {os.path.relpath(out, ROOT)} exists; a prediction is written once, before its "
                         "measurement")
    try:
        env = parse_env(args.env)
    except ConfigError as err:
        raise SystemExit(f"predict: {err}") from None
    sim = simulate_argv(args)
    proc = subprocess.run([sys.executable, "-m", "byteps_prophet", *sim], capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), **env))
    if proc.returncode != 0:
        raise SystemExit(f"predict: simulate failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    result = json.loads(proc.stdout)
    per_step = result["workers"] * result["batch"]
    predicted = {v: {"step_s": round(result["results"][v]["iter_ms"] / 1e3, 4),
                     "samples_per_s": round(per_step / (result["results"][v]["iter_ms"] / 1e3), 4)}
                 for v in VARIANTS}
    measure_name = args.name if args.name.startswith("ab-") else f"ab-{args.name}"
    prefix = "".join(f"{k}={v} " for k, v in env.items())
    doc = {"commit": git_commit(), "command": prefix + "byteps-prophet " + " ".join(sim),
           "configuration": args.configuration, "inputs": args.inputs,
           "held_out": "no run of this configuration was used to calibrate or tune the model; this file is "
                       "committed before the configuration is measured",
           "samples_per_step": per_step, "predicted": predicted,
           "predicted_order": sorted(VARIANTS, key=lambda v: -predicted[v]["samples_per_s"]),
           "measure_with": args.measure_with,
           "measurement_file": f"scripts/benchmarks/data/ab/{measure_name}.json",
           "target": TARGET, "simulate": result}
    out.write_text(json.dumps(doc, indent=1) + "\n")
    for v in VARIANTS:
        print(f"{v:14s} {predicted[v]['samples_per_s']:8.2f} samples/s  ({predicted[v]['step_s']:.3f} s/step)")
    print(f"wrote {os.path.relpath(out, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
