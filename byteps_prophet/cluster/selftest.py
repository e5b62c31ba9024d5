"""Worker self-test: ``python -m byteps_prophet.cluster.selftest [--size N] [--rounds R]``.

Each worker pushes ``(worker_id + 1) * (round + 1)`` in every element and pulls the aggregate back;
the result must be exactly ``(round + 1) * n * (n + 1) / 2`` for n workers (small integers are exact
in float32). Uses the engine named by ``ENGINE``: byteps (``byteps.torch.push_pull``) or mxnet
(``mx.kv.create('dist_sync')`` push/pull). Exits 0 and prints ``selftest OK`` on success, 1 on a
wrong sum. It is the default worker command of docker/docker-compose.yml.
"""
from __future__ import annotations

import argparse
import os
import sys
import time


def _expected(round_index: int, workers: int) -> float:
    return float((round_index + 1) * workers * (workers + 1) // 2)


def _run_mxnet(size: int, rounds: int, worker_id: int):
    import mxnet as mx

    kv = mx.kv.create("dist_sync")
    workers = kv.num_workers
    kv.init(0, mx.nd.zeros((size,)))
    for r in range(rounds):
        kv.push(0, mx.nd.full((size,), float((worker_id + 1) * (r + 1))))
        out = mx.nd.zeros((size,))
        kv.pull(0, out=out)
        yield r, workers, out.asnumpy()


def _run_byteps(size: int, rounds: int, worker_id: int):
    import torch
    import byteps.torch as bps

    bps.init()
    try:
        workers = bps.size()
        for r in range(rounds):
            tensor = torch.full((size,), float((worker_id + 1) * (r + 1)))
            out = bps.push_pull(tensor, average=False, name="byteps_prophet.selftest")
            yield r, workers, out.numpy()
    finally:
        bps.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m byteps_prophet.cluster.selftest")
    parser.add_argument("--size", type=int, default=int(os.environ.get("SELFTEST_SIZE", 262144)),
                        help="float32 elements per push (default 262144 = 1 MiB)")
    parser.add_argument("--rounds", type=int, default=int(os.environ.get("SELFTEST_ROUNDS", 3)))
    args = parser.parse_args(argv)
    engine = os.environ.get("ENGINE", "byteps").strip().lower()
    worker_id = int(os.environ.get("DMLC_WORKER_ID", "0"))
    runs = {"mxnet": _run_mxnet, "byteps": _run_byteps}
    if engine not in runs:
        print(f"selftest: ENGINE={engine!r} is not an engine; valid: {', '.join(runs)}", file=sys.stderr)
        return 2
    start = time.monotonic()
    workers = 0
    for r, workers, values in runs[engine](args.size, args.rounds, worker_id):
        want = _expected(r, workers)
        wrong = int((values != want).sum())
        if wrong:
            print(f"selftest FAILED: worker {worker_id}, round {r}: {wrong} of {values.size} elements "
                  f"differ from {want} (first: {values.flat[0]})", flush=True)
            return 1
    print(f"selftest OK: worker {worker_id} of {workers}, engine {engine}, {args.rounds} rounds of "
          f"{args.size} floats, last sum {_expected(args.rounds - 1, workers):g}, "
          f"{time.monotonic() - start:.2f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
