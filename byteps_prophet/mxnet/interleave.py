"""Interleaved MXNet scheduler comparison on one shaped local cluster (superseded by `byteps-prophet ab
--framework mxnet`, kept for ad-hoc configs such as a swept credit).

``python -m byteps_prophet.mxnet.interleave --model vgg --bandwidth 2gbit --rounds 2 \\
      --config fifo --config bytescheduler --config bytescheduler:credit=16000000 --config prophet``

Each round runs every config once, in order, on the same cluster (hosts, links and shaping persist);
prints one JSON line per run and a summary of median samples/s and ratios to the first config.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys


def parse_config(text: str) -> tuple[str, dict]:
    name, _, rest = text.partition(":")
    env = {"BYTEPS_SCHEDULER": name}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        env[{"credit": "BYTESCHEDULER_CREDIT", "partition": "BYTESCHEDULER_PARTITION"}.get(key, key)] = value
    return text, env


def main(argv=None) -> int:
    from byteps_prophet.cluster import Cluster, ClusterSpec

    p = argparse.ArgumentParser(prog="python -m byteps_prophet.mxnet.interleave")
    p.add_argument("--model", default="vgg")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--bandwidth", default="2gbit")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--config", action="append", default=[])
    args = p.parse_args(argv)
    configs = [parse_config(c) for c in (args.config or ["fifo", "bytescheduler", "prophet"])]
    spec = ClusterSpec(workers=args.workers, servers=1, bandwidth=args.bandwidth, engine="mxnet")
    command = [sys.executable, "-m", "byteps_prophet.mxnet.bench", "--model", args.model, "--batch",
               str(args.batch), "--steps", str(args.steps), "--warmup", str(args.warmup)]
    results: dict[str, list[float]] = {name: [] for name, _ in configs}
    with Cluster(spec, output=False) as cluster:
        for r in range(args.rounds):
            for name, env in configs:
                res = cluster.run(command, env=env, timeout=900)
                lines = [l for role in res.output.values() for l in role if l.lstrip().startswith("{")]
                line = lines[-1] if res.ok and lines else None
                if line is None:
                    print(json.dumps({"config": name, "round": r, "ok": False, "reason": res.reason}), flush=True)
                    continue
                data = json.loads(line[line.index("{"):])
                results[name].append(data["samples_per_s"])
                print(json.dumps({"config": name, "round": r, "samples_per_s": data["samples_per_s"],
                                  "step_s_median": data["step_s_median"],
                                  "bandwidth_Bps": data.get("bandwidth_Bps")}), flush=True)
    base = statistics.median(results[configs[0][0]]) if results[configs[0][0]] else None
    summary = {name: {"median_samples_per_s": statistics.median(v) if v else None, "runs": v,
                      "ratio_to_first": (statistics.median(v) / base) if v and base else None}
               for name, v in results.items()}
    print(json.dumps({"summary": summary, "model": args.model, "bandwidth": args.bandwidth}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
