#!/usr/bin/env python3
"""Workers out of step: does the simulator, every worker simulated on its own and started the
recorded skew apart (``simulate --skew``), predict BytePS-MXNet's steps where the one
representative worker cannot?

BytePS-MXNet's rounds fall into two states (docs/ENGINE.md, "The current replay"): workers within
0.25 s of each other (2.9-3.3 s a step) or 0.3-0.5 s apart (2.1-2.6 s). The skew is a condition of
the run, as its compute is: this benchmark takes it from both workers' traces and gives it to the
simulator.

    scripts/bench_skew.py --import DIR --commit C --command "byteps-prophet ab ... --record DIR"
        # keep the profiles and per-step skews of an ``ab --record`` folder (both workers' traces)
    scripts/bench_skew.py        # replay what docs/replay/skew/ holds; docs/replay/skew/results.json
    scripts/bench_skew.py --set skew-cubic   # another set of rounds: docs/replay/skew-cubic/

For each kept round: the recorded timed steps but the last (which ends at the final sync), their
mean against the simulator's, one representative worker and every worker on its own with the
round's median skew (the other worker's first staged gradient less the leader's, per timed step).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]
import bench_replay  # noqa: E402  (the replay's configuration, link and runner: one of each)
from byteps_prophet.core.trace import step_skews  # noqa: E402

REPLAY = ROOT / "docs" / "replay"  # each set of rounds a folder of it (``--set``, default skew)
# BBR's configuration and engine for every set (the skew-cubic figures of docs/ENGINE.md too: "the
# engine calibrated under BBR")
CONFIG = bench_replay.CONFIGS["mxnet_byteps_transformer_200m_bbr"]
ENV = {"BYTEPS_PROPHET_FUSE": "0", **CONFIG["env"]}  # the plugin's atoms, unfused
WARMUP = 3


def import_folder(folder: Path, out: Path, commit: str, command: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    index_file = out / "skews.json"
    index = json.loads(index_file.read_text()) if index_file.is_file() else {"rounds": []}
    for profile in sorted(folder.glob("*_r*.profile.json")):
        base = profile.name[: -len(".profile.json")]
        others = sorted(folder.glob(f"{base}.trace.rank*.json"))
        if not (folder / f"{base}.trace.json").is_file() or not others:
            print(f"bench_skew: {base}: skipped, both workers' traces are needed", file=sys.stderr)
            continue
        steps = len(json.loads(profile.read_text())["iterations"])
        skews = step_skews(json.loads((folder / f"{base}.trace.json").read_text()),
                           json.loads(others[0].read_text()), steps)
        kept = f"{commit}_{folder.name}_{base}.profile.json"
        shutil.copyfile(profile, out / kept)
        index["rounds"].append({"profile": kept, "variant": base.split("_r")[0], "skews_s": skews,
                                "skew_s": statistics.median(skews), "commit": commit, "command": command})
    index_file.write_text(json.dumps(index, indent=1) + "\n")


def simulate(profile: str, variant: str, steps: int, skew: float | None) -> tuple[list[float], str]:
    engine = REPLAY / f"engine_{CONFIG['engine']}.json"
    argv = ["simulate", "--profile", profile, "--workers", "2", "--arch", "ps", "--servers", "1",
            *bench_replay.link_args(engine, CONFIG["bandwidth"], True, CONFIG["arch"]), "--scheduler", variant,
            "--steps", str(steps), "--warmup", str(WARMUP), "--json"] + (["--skew", str(skew)] if skew is not None else [])
    proc = bench_replay.run(bench_replay.cli(*argv), locked=False, timeout=600, env=ENV)
    steps_ms = json.loads(proc.stdout)["results"][variant]["steps_ms"]
    command = " ".join(f"{k}={v}" for k, v in ENV.items()) + " byteps-prophet " + " ".join(argv)
    return [t / 1e3 for t in steps_ms], command


def inner(steps: list[float]) -> float:
    return statistics.mean(steps[:-1])


def replay(out: Path) -> dict:
    index = json.loads((out / "skews.json").read_text())
    rows = []
    for r in index["rounds"]:
        profile = os.path.relpath(out / r["profile"], ROOT)
        recorded = [it["iteration_s"] for it in json.loads((ROOT / profile).read_text())["iterations"]]
        one, _ = simulate(profile, r["variant"], len(recorded), None)
        every, command = simulate(profile, r["variant"], len(recorded), r["skew_s"])
        measured = inner(recorded)
        rows.append({"profile": r["profile"], "variant": r["variant"], "skew_s": r["skew_s"],
                     "measured_s": round(measured, 4), "representative_s": round(inner(one), 4),
                     "representative_error": round(inner(one) / measured - 1, 4),
                     "every_worker_s": round(inner(every), 4), "every_worker_error": round(inner(every) / measured - 1, 4),
                     "command": command})
    return {"commit": bench_replay.git_commit(), "rows": rows}


def table(results: dict) -> str:
    lines = ["| round | variant | skew (s) | recorded s/step | one representative | every worker, skewed |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in results["rows"]:
        lines.append(f"| {r['profile'].split('.profile')[0]} | {r['variant']} | {r['skew_s']:+.2f} | {r['measured_s']:.3f} | "
                     f"{r['representative_s']:.3f} ({r['representative_error']:+.1%}) | "
                     f"{r['every_worker_s']:.3f} ({r['every_worker_error']:+.1%}) |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--import", dest="folder", metavar="DIR", help="keep the rounds of an `ab --record` folder")
    p.add_argument("--commit", help="with --import: the commit the rounds were recorded at")
    p.add_argument("--command", help="with --import: the command that recorded them")
    p.add_argument("--set", default="skew", metavar="NAME",
                   help="the set of rounds, docs/replay/NAME/ (default skew: BytePS-MXNet under this machine's BBR)")
    p.add_argument("--json", action="store_true", help="print the results JSON instead of the table")
    args = p.parse_args(argv)
    if not args.set or "/" in args.set or args.set.startswith("."):
        print(f"bench_skew: --set {args.set!r} is invalid; valid: a folder name under docs/replay/", file=sys.stderr)
        return 2
    out = REPLAY / args.set
    if args.folder:
        folder = Path(args.folder)
        if not folder.is_dir() or not args.commit or not args.command:
            print(f"bench_skew: --import {args.folder!r} needs an existing folder, --commit and --command",
                  file=sys.stderr)
            return 2
        import_folder(folder, out, args.commit, args.command)
        return 0
    if not (out / "skews.json").is_file():
        print(f"bench_skew: {out / 'skews.json'} is missing; valid: --import DIR first", file=sys.stderr)
        return 2
    results = replay(out)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1) if args.json else table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
