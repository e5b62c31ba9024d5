#!/usr/bin/env python
"""Where a step's communication ends, against the slowest worker's backward pass.

Reads rank 0's trace (``BYTEPS_PROPHET_TRACE``, or ``byteps-prophet ab --record DIR``:
``DIR/<variant>_r<round>.trace.json``) and the other ranks' ``<trace>.rank<N>.json`` beside it. On a
parameter server or an all-reduce nothing completes before every worker has its gradient, so the
useful reference is the *slowest* worker's end of backward. Per iteration it prints each rank's
backward span, how far the slowest ended after rank 0, the tail (last completion after that end),
how many pieces rank 0 submitted only after it (pieces held while the link could have carried
them), and the forward waits of the next iteration. docs/history/AB-notebook.md section 12 is what it was made for.
At rank 0's own end of backward it also gives the bytes it had in flight, when gradient 0 was done
after it, and the start-up latency its link monitor read then (the last op issued before it:
docs/ENGINE.md, "Prophet's pauses on BytePS, measured").

    .venv/bin/python scripts/trace_tails.py out/ab/diag/prophet_r0.trace.json [...] [--json]
"""
from __future__ import annotations

import argparse
import glob
import json
import statistics
import sys

from byteps_prophet.core import trace


def load(path: str) -> dict[int, dict]:
    """Per iteration: ready times, end of backward, ops (submit and completion times), forward waits."""
    doc = trace.load(path)  # ValueError: not a trace file
    iterations: dict[int, dict] = {}

    def it(event):
        return iterations.setdefault(event["args"]["iteration"], {"ready": [], "eob": None, "ops": [], "wait": 0.0})

    for event in trace.events(doc, "ready"):
        it(event)["ready"].append(trace.seconds(event["ts"]))
    for event in trace.events(doc, "eob"):
        it(event)["eob"] = trace.seconds(event["ts"])
    for event in trace.events(doc, "op"):
        args = event["args"]
        it(event)["ops"].append({"submit": trace.seconds(args.get("submit_ts")),
                                 "issue": trace.seconds(args.get("issue_ts", event["ts"])),
                                 "done": trace.seconds(event["ts"] + event["dur"]),
                                 "bytes": args.get("bytes", 0), "index": args.get("index"),
                                 "latency": args.get("latency_s")})
    for event in trace.events(doc, "wait"):
        it(event)["wait"] += event["dur"] / 1e6
    return iterations


def peers_of(path: str) -> list[str]:
    stem = path[:-5] if path.endswith(".json") else path
    return sorted(glob.glob(f"{glob.escape(stem)}.rank*.json"))


def tails(path: str) -> dict:
    ranks = [load(path)] + [load(p) for p in peers_of(path)]
    rows = []
    every_op = [op for it in ranks[0].values() for op in it["ops"]]
    for index in sorted(ranks[0]):
        its = [r.get(index) for r in ranks]
        if any(it is None or it["eob"] is None or not it["ready"] for it in its) or not its[0]["ops"]:
            continue  # an iteration some rank did not finish (the last, usually)
        slowest = max(it["eob"] for it in its)
        ops = its[0]["ops"]
        following = [r.get(index + 1) for r in ranks]
        eob = its[0]["eob"]
        before = [op for op in every_op if op["issue"] is not None and op["issue"] <= eob]
        last = max(before, key=lambda op: op["issue"]) if before else None
        first = [op["done"] for op in ops if op["index"] == 0]
        rows.append({
            "iteration": index,
            "backward_s": [round(it["eob"] - min(it["ready"]), 4) for it in its],
            "slowest_after_rank0_s": round(slowest - its[0]["eob"], 4),
            "tail_s": round(max(op["done"] for op in ops) - slowest, 4),
            "submitted_after": sum(1 for op in ops if op["submit"] is not None and op["submit"] > slowest),
            "next_forward_wait_s": [round(it["wait"], 4) if it else None for it in following],
            "in_flight_at_eob_bytes": sum(op["bytes"] for op in before if op["issue"] < eob < op["done"]),
            "gradient0_after_eob_s": round(max(first) - eob, 4) if first else None,
            "latency_at_eob_s": last["latency"] if last else None,
        })
    summary = {}
    if rows:
        summary = {"iterations": len(rows),
                   "tail_s_median": round(statistics.median(r["tail_s"] for r in rows), 4),
                   "tail_s_max": max(r["tail_s"] for r in rows),
                   "iterations_with_held_pieces": sum(1 for r in rows if r["submitted_after"])}
    return {"trace": path, "ranks": len(ranks), "rows": rows, "summary": summary}


def _num(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="+", metavar="TRACE", help="rank 0's trace file(s)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per trace")
    args = parser.parse_args(argv)
    for path in args.traces:
        try:
            result = tails(path)
        except ValueError as err:
            parser.error(str(err))
        if args.json:
            print(json.dumps(result))
            continue
        print(f"{path} ({result['ranks']} ranks)")
        print("  iter  backward per rank (s)   slowest +s   tail s  held  in flight MB  grad 0 +s  latency s"
              "  next forward waits (s)")
        for r in result["rows"]:
            print(f"  {r['iteration']:4d}  {' '.join(f'{b:.3f}' for b in r['backward_s']):22s}"
                  f"  {r['slowest_after_rank0_s']:+9.3f}  {r['tail_s']:7.3f}  {r['submitted_after']:4d}"
                  f"  {r['in_flight_at_eob_bytes'] / 1e6:12.2f}  {_num(r['gradient0_after_eob_s']):>9}"
                  f"  {_num(r['latency_at_eob_s']):>9}  "
                  f"{' '.join('-' if w is None else f'{w:.3f}' for w in r['next_forward_wait_s'])}")
        if result["summary"]:
            s = result["summary"]
            print(f"  tail median {s['tail_s_median']:.3f} s, max {s['tail_s_max']:.3f} s; "
                  f"{s['iterations_with_held_pieces']} of {s['iterations']} iterations with pieces held past it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
