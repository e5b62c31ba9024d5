#!/usr/bin/env python3
"""Stress BytePS's server for lost or stale updates: many short training runs on the local cluster,
every rank's parameters compared with the single-process reference after every step.

Each run is one fresh cluster (`byteps-prophet cluster run`) training a plain script that checks every
step (`--path`: torch, tests/byteps/stress_worker.py over BytePS; byteps-mxnet, tests/mxnet/stress_worker.py
with BytePS's DistributedTrainer; kvstore, the same with Gluon over MXNet's dist_sync parameter server)
under one configuration: a scheduler (BYTEPS_SCHEDULER), the BytePS server's engine threads, and the
idle back-off of patch 0011 on or off. Configurations take turns, so a slow
spell of the machine falls on all of them. A run fails when any rank's parameters leave the reference
(or the ranks end apart, or the run does not end cleanly).

    scripts/stress_pushpull.py --runs 200                 # the documented long form (docs/BYTEPS.md)
    scripts/stress_pushpull.py --runs 4 --json out.json   # the CI form: every configuration once

Exit status 0 when every run matched, 1 otherwise; one JSON record per run with --json.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
# --path: the worker script, the cluster's engine, and the worker's environment
PATHS = {"torch": (ROOT / "tests" / "byteps" / "stress_worker.py", "byteps", {}),
         "byteps-mxnet": (ROOT / "tests" / "mxnet" / "stress_worker.py", "byteps", {"STRESS_STORE": "byteps"}),
         "kvstore": (ROOT / "tests" / "mxnet" / "stress_worker.py", "mxnet", {"STRESS_STORE": "kvstore"})}
SCHEDULERS = ("fifo", "bytescheduler", "prophet")
BACKOFF = {"on": {}, "off": {"PS_ZMQ_IDLE_US": "0", "BYTEPS_LOOP_IDLE_US": "1"}}
LINE = re.compile(r"rank (\d+) steps (\d+) mismatch_step (-?\d+) max_diff (\S+) sum (\S+)")


def configurations(schedulers, threads, backoffs):
    return [dict(scheduler=s, engine_threads=t, backoff=b) for s, t, b in itertools.product(schedulers, threads, backoffs)]


def run_once(config: dict, args) -> dict:
    worker, engine, worker_env = PATHS[args.path]
    env = {"BYTEPS_SERVER_ENGINE_THREAD": str(config["engine_threads"]), "STRESS_STEPS": str(args.steps),
           "STRESS_LAYERS": str(args.layers), **worker_env, **BACKOFF[config["backoff"]], **dict(args.env)}
    cmd = [str(ROOT / ".venv" / "bin" / "byteps-prophet"), "cluster", "run", "--workers", str(args.workers),
           "--servers", "1", "--engine", engine, "--bandwidth", args.bandwidth, "--timeout", str(args.timeout)]
    for key, value in env.items():
        cmd += ["-e", f"{key}={value}"]
    cmd += ["--", sys.executable, str(worker)]
    started = time.monotonic()
    proc = subprocess.run(cmd, env={**os.environ, "BYTEPS_SCHEDULER": config["scheduler"]},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ranks = {int(m.group(1)): {"mismatch_step": int(m.group(3)), "max_diff": float(m.group(4)),
                               "sum": m.group(5)} for m in LINE.finditer(proc.stdout)}
    sums = {r["sum"] for r in ranks.values()}
    matched = (proc.returncode == 0 and len(ranks) == args.workers and len(sums) == 1
               and all(r["mismatch_step"] < 0 for r in ranks.values()))
    record = {**config, "path": args.path, "steps": args.steps, "layers": args.layers, "rc": proc.returncode, "matched": matched,
              "seconds": round(time.monotonic() - started, 2), "ranks": ranks}
    if not matched:
        record["tail"] = proc.stdout.splitlines()[-3:]
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--path", default="torch", choices=tuple(PATHS),
                        help="what trains: torch (byteps.torch), byteps-mxnet (byteps.mxnet's trainer), kvstore "
                             "(Gluon over MXNet's dist_sync); default torch")
    parser.add_argument("--runs", type=int, default=20, help="runs in all, configurations in turn (default 20)")
    parser.add_argument("--schedulers", default="fifo,bytescheduler,prophet",
                        help=f"comma-separated, of {', '.join(SCHEDULERS)} (default: all)")
    parser.add_argument("--engine-threads", default="4", help="server engine threads, comma-separated (default 4)")
    parser.add_argument("--backoff", default="on,off", help="idle back-off of patch 0011: on, off or on,off")
    parser.add_argument("--steps", type=int, default=200, help="training steps a run (default 200)")
    parser.add_argument("--layers", type=int, default=2,
                        help="linear layers of the model (default 2: the fastest steps, the tightest rounds)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--bandwidth", default="500mbit", help="each link, tc units (default 500mbit)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds a run may take (default 120)")
    parser.add_argument("-e", "--env", action="append", default=[], type=_pair, metavar="KEY=VALUE",
                        help="extra environment for every role (repeatable)")
    parser.add_argument("--stop-on-failure", action="store_true", help="stop at the first run that fails")
    parser.add_argument("--json", type=Path, help="write every run's record here")
    args = parser.parse_args(argv)
    schedulers = _choices(parser, "--schedulers", args.schedulers, SCHEDULERS)
    backoffs = _choices(parser, "--backoff", args.backoff, tuple(BACKOFF))
    try:
        threads = [int(t) for t in args.engine_threads.split(",")]
    except ValueError:
        parser.error(f"--engine-threads {args.engine_threads!r} is not a list of integers; valid: e.g. 1,4")
    if args.runs < 1 or args.steps < 1 or args.layers < 2 or args.workers < 2 or min(threads) < 1:
        parser.error("--runs, --steps and --engine-threads must be >= 1, --layers and --workers >= 2")
    configs = configurations(schedulers, threads, backoffs)
    records = []
    with tqdm(total=args.runs, desc="stress", unit="run", file=sys.stderr) as bar:
        for i in range(args.runs):
            record = run_once(configs[i % len(configs)], args)
            records.append(record)
            bar.update()
            bar.set_postfix(failed=sum(not r["matched"] for r in records))
            if not record["matched"]:
                tqdm.write(f"run {i}: {_describe(record)}", file=sys.stderr)
                if args.stop_on_failure:
                    break
    failed = sum(not r["matched"] for r in records)
    print(f"stress_pushpull: {len(records) - failed} of {len(records)} runs matched the reference")
    if args.json:
        args.json.write_text(json.dumps({"command": sys.argv, "runs": records}, indent=1))
    return 1 if failed else 0


def _describe(record: dict) -> str:
    where = ", ".join(f"rank {r} from step {v['mismatch_step']}" for r, v in sorted(record["ranks"].items())
                      if v["mismatch_step"] >= 0)
    return (f"{record['scheduler']}, {record['engine_threads']} engine threads, back-off {record['backoff']}: "
            f"rc={record['rc']}, {where or 'no mismatch reported'}")


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def _choices(parser, flag: str, text: str, valid: tuple[str, ...]) -> list[str]:
    chosen = [c.strip() for c in text.split(",") if c.strip()]
    bad = [c for c in chosen if c not in valid]
    if bad or not chosen:
        parser.error(f"{flag} {text!r}: {', '.join(bad) or 'empty'} is not one; valid: {', '.join(valid)}")
    return chosen


if __name__ == "__main__":
    sys.exit(main())
