"""Worker self-test: ``python -m byteps_prophet.cluster.selftest [--sizes N,M] [--rounds R]``.

Each worker pushes ``(worker_id + 1) * (round + 1)`` in every element of one tensor per size (each
under its own name, the same name every round) and pulls the aggregate back; the result must be
exactly ``(round + 1) * n * (n + 1) / 2`` for n workers (small integers are exact in float32). Uses
the engine named by ``ENGINE``: mxnet (``mx.kv.create('dist_sync')`` push/pull) or byteps, through
the plugin named by ``SELFTEST_FRAMEWORK`` (torch: ``byteps.torch.push_pull``, the default; mxnet:
``byteps.mxnet.byteps_push_pull``). Exits 0 and prints ``selftest OK`` on success, 1 on a wrong sum.
It is the default worker command of docker/docker-compose.yml.
"""
from __future__ import annotations

import argparse
import sys
import time

from byteps_prophet.backends.rendezvous import rendezvous
from byteps_prophet.cluster.container import container, parse_sizes
from byteps_prophet.errors import ConfigError


def _expected(round_index: int, workers: int) -> float:
    return float((round_index + 1) * workers * (workers + 1) // 2)


def _pushed(round_index: int, worker_id: int) -> float:
    return float((worker_id + 1) * (round_index + 1))


def _run_mxnet(sizes: list[int], rounds: int, worker_id: int):
    import mxnet as mx

    kv = mx.kv.create("dist_sync")
    for key, size in enumerate(sizes):
        kv.init(key, mx.nd.zeros((size,)))
    for r in range(rounds):
        for key, size in enumerate(sizes):
            kv.push(key, mx.nd.full((size,), _pushed(r, worker_id)))
            out = mx.nd.zeros((size,))
            kv.pull(key, out=out)
            yield r, kv.num_workers, out.asnumpy()


def _run_byteps_torch(sizes: list[int], rounds: int, worker_id: int):
    import torch
    import byteps.torch as bps

    bps.init()
    try:
        for r in range(rounds):
            for size in sizes:
                tensor = torch.full((size,), _pushed(r, worker_id))
                out = bps.push_pull(tensor, average=False, name=f"byteps_prophet.selftest.{size}")
                yield r, bps.size(), out.numpy()
    finally:
        bps.shutdown()


def _run_byteps_mxnet(sizes: list[int], rounds: int, worker_id: int):
    import mxnet as mx
    import byteps.mxnet as bps

    bps.init()
    try:
        for size in sizes:
            bps.byteps_declare_tensor(f"selftest.{size}")
        for r in range(rounds):
            for size in sizes:
                tensor = mx.nd.full((size,), _pushed(r, worker_id))
                bps.byteps_push_pull(tensor, name=f"selftest.{size}", is_average=False)
                yield r, bps.size(), tensor.asnumpy()  # asnumpy waits for the in-place push_pull
    finally:
        bps.shutdown()


BYTEPS_PLUGINS = {"torch": _run_byteps_torch, "mxnet": _run_byteps_mxnet}  # SELFTEST_FRAMEWORK


def _sizes(text: str) -> list[int]:
    try:
        return list(parse_sizes(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of positive integers") from None


def main(argv: list[str] | None = None) -> int:
    try:
        job, worker_id = container(), rendezvous().worker_id or 0
    except ConfigError as err:
        print(f"selftest: {err}", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog="python -m byteps_prophet.cluster.selftest")
    parser.add_argument("--sizes", type=_sizes, default=list(job.selftest_sizes),
                        help="float32 elements of each tensor, comma-separated (default SELFTEST_SIZES or 7,262144: "
                             "a tiny one and 1 MiB, several partitions under a small BYTEPS_PARTITION_BYTES)")
    parser.add_argument("--rounds", type=int, default=job.selftest_rounds, help="default SELFTEST_ROUNDS or 3")
    args = parser.parse_args(argv)
    engine, framework = job.engine, job.selftest_framework
    run = {"mxnet": _run_mxnet, "byteps": BYTEPS_PLUGINS[framework]}[engine]
    start = time.monotonic()
    workers = 0
    for r, workers, values in run(args.sizes, args.rounds, worker_id):
        want = _expected(r, workers)
        wrong = int((values != want).sum())
        if wrong:
            print(f"selftest FAILED: worker {worker_id}, round {r}: {wrong} of {values.size} elements "
                  f"differ from {want} (first: {values.flat[0]})", flush=True)
            return 1
    via = f" ({framework})" if engine == "byteps" else ""
    print(f"selftest OK: worker {worker_id} of {workers}, engine {engine}{via}, {args.rounds} rounds of "
          f"{'+'.join(map(str, args.sizes))} floats, last sum {_expected(args.rounds - 1, workers):g}, "
          f"{time.monotonic() - start:.2f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
