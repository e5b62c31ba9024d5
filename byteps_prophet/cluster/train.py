"""A real training job on the cluster: ``python -m byteps_prophet.cluster.train``.

The compose file's second session (``TRAIN_COMMAND``): every worker trains a real model on synthetic
data through the engine named by ``ENGINE`` and worker 0 prints the benchmark's JSON line:

* byteps: ``python -m byteps_prophet.torch.bench --backend byteps`` (PyTorch on BytePS);
* mxnet:  ``python -m byteps_prophet.mxnet.bench --backend kvstore`` (MXNet's dist_sync KVStore).

The scheduler is ``BYTEPS_SCHEDULER``, ``prophet`` when it is unset. ``TRAIN_MODEL`` (resnet),
``TRAIN_STEPS`` (10), ``TRAIN_WARMUP`` (3) and ``TRAIN_BATCH`` (the bench's default) pick the job;
options after ``--`` go to the bench as they are. The same command runs in the local cluster
(``byteps-prophet cluster run --engine byteps -- python -m byteps_prophet.cluster.train``), which is
how docs/CLUSTER.md compares a compose run with a netns run of one job.
"""
from __future__ import annotations

import os
import sys

BENCHES = {"byteps": ("byteps_prophet.torch.bench", "byteps"), "mxnet": ("byteps_prophet.mxnet.bench", "kvstore")}


def bench_argv(environ, extra: list[str]) -> list[str]:
    engine = environ.get("ENGINE", "byteps").strip().lower()
    if engine not in BENCHES:
        raise ValueError(f"ENGINE={engine!r} is not an engine; valid: {', '.join(BENCHES)}")
    module, backend = BENCHES[engine]
    argv = [sys.executable, "-m", module, "--backend", backend,
            "--model", environ.get("TRAIN_MODEL", "resnet"),
            "--steps", environ.get("TRAIN_STEPS", "10"),
            "--warmup", environ.get("TRAIN_WARMUP", "3")]
    if environ.get("TRAIN_BATCH"):
        argv += ["--batch", environ["TRAIN_BATCH"]]
    return argv + extra


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--":
        argv = argv[1:]
    try:
        command = bench_argv(os.environ, argv)
    except ValueError as err:
        print(f"train: {err}", file=sys.stderr)
        return 2
    if not os.environ.get("BYTEPS_SCHEDULER", "").strip():
        os.environ["BYTEPS_SCHEDULER"] = "prophet"
    print(f"train: {os.environ['BYTEPS_SCHEDULER']} on {os.environ.get('ENGINE', 'byteps')}: "
          f"{' '.join(command[1:])}", file=sys.stderr, flush=True)
    os.execv(command[0], command)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
