"""A real training job on the cluster: ``python -m byteps_prophet.ab.workloads.train_entrypoint``.

The compose file's second session (``TRAIN_COMMAND``): every worker trains a real model on synthetic
data through the engine named by ``ENGINE`` and worker 0 prints the benchmark's JSON line:

* byteps: ``python -m byteps_prophet.ab.workloads.torch_bench --backend byteps`` (PyTorch on BytePS);
* mxnet:  ``python -m byteps_prophet.ab.workloads.mxnet_bench --backend kvstore`` (MXNet's dist_sync KVStore).

The scheduler is ``BYTEPS_SCHEDULER``, ``prophet`` when it is unset. ``TRAIN_MODEL`` (resnet),
``TRAIN_STEPS`` (10), ``TRAIN_WARMUP`` (3) and ``TRAIN_BATCH`` (the bench's default) pick the job;
options after ``--`` go to the bench as they are. The same command runs in the local cluster
(``byteps-prophet cluster run --engine byteps -- python -m byteps_prophet.ab.workloads.train_entrypoint``), which is
how docs/CLUSTER.md compares a compose run with a netns run of one job.
"""
from __future__ import annotations

import os
import sys

from byteps_prophet.ab.workloads import mxnet_bench, torch_bench
from byteps_prophet.cluster.container import Container, container
from byteps_prophet.core.settings import Settings
from byteps_prophet.errors import ConfigError

# The compose cluster's engine -> the benchmark that trains on it and the benchmark's backend.
ENGINE_BENCHES = {"byteps": (torch_bench, "byteps"), "mxnet": (mxnet_bench, "kvstore")}


def bench_argv(job: Container, extra: list[str]) -> list[str]:
    bench, backend = ENGINE_BENCHES[job.engine]
    argv = [sys.executable, "-m", bench.__name__, "--backend", backend, "--model", job.train_model,
            "--steps", str(job.train_steps), "--warmup", str(job.train_warmup)]
    if job.train_batch is not None:
        argv += ["--batch", str(job.train_batch)]
    return argv + extra


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--":
        argv = argv[1:]
    env = dict(os.environ)  # the bench's: BYTEPS_SCHEDULER is prophet unless set
    env["BYTEPS_SCHEDULER"] = env.get("BYTEPS_SCHEDULER", "").strip() or "prophet"
    try:
        job, scheduler = container(env), Settings.from_env(env).scheduler
    except ConfigError as err:
        print(f"train: {err}", file=sys.stderr)
        return 2
    command = bench_argv(job, argv)
    print(f"train: {scheduler} on {job.engine}: {' '.join(command[1:])}", file=sys.stderr, flush=True)
    os.execve(command[0], command, env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
