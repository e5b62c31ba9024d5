#!/usr/bin/env python
"""The per-message cost the plugins' LinkMonitor reads against calibrate's, on the same completions:
each engine profile's raw back-to-back stream (``measured.raw.stream``: when every op was issued and
completed on worker 0) is fed through a LinkMonitor in time order, as the plugin sees its ops, and
its readings are printed beside calibrate's fit (docs/DESIGN.md, "Fused collectives", "The cost
fusion reads"). No cluster; deterministic.

    .venv/bin/python scripts/monitor_vs_calibrate.py docs/replay/engine_gloo.json out/engine_gloo_4w.json
"""
from __future__ import annotations

import argparse
import json
import sys

from byteps_prophet.calibrate.fit import fit_link, service_samples
from byteps_prophet.core import Task
from byteps_prophet.core.link import LinkMonitor


def replay(stream: list[dict], monitor: LinkMonitor) -> LinkMonitor:
    events = []
    for group in stream:
        for sent, done in zip(group["issued"], group["done"]):
            task = Task(f"op{len(events)}", 0, (max(1, int(group["tensor_bytes"]) // 4),))
            events += [(sent, 0, task), (done, 1, task)]
    for t, kind, task in sorted(events, key=lambda e: (e[0], e[1])):
        (monitor.on_send if kind == 0 else monitor.on_finish)(task, t)
    return monitor


def compare(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        raw = json.load(f)["measured"]["raw"]
    cost, rate = fit_link(service_samples(raw["stream"]))
    out = {"file": path, "workers": raw["workers"], "calibrate_cost_ms": round(cost * 1e3, 3)}
    for window, label in ((32, "window32"), (10**6, "all")):
        monitor = replay(raw["stream"], LinkMonitor(window=window, serializations=1))
        out[f"monitor_cost_ms_{label}"] = round(monitor.rate_and_cost()[1] * 1e3, 3)
        out[f"monitor_collective_cost_ms_{label}"] = round(monitor.rate_and_cost(collective=True)[1] * 1e3, 3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profiles", nargs="+", metavar="ENGINE_JSON", help="engine profiles written by calibrate")
    args = ap.parse_args()
    for path in args.profiles:
        try:
            print(json.dumps(compare(path)))
        except (OSError, ValueError, KeyError, TypeError) as err:
            print(f"monitor_vs_calibrate: {path!r} is not an engine profile with raw timings ({err!r}); valid: a "
                  "file written by `byteps-prophet calibrate` (measured.raw.stream)", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
