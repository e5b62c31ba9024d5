"""Plain loopback launcher: N torch.distributed worker processes on 127.0.0.1, for tests and quick runs
without namespaces or shaping (bandwidth is NOT applied).

A thin wrapper over the one process launcher, the local cluster (``byteps_prophet.cluster.local``) on
plain loopback without a parameter server. Each worker gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT`` (a free port) and the BytePS-style ``DMLC_WORKER_ID``/
``DMLC_NUM_WORKER``. The run ends when all exit 0, or as soon as one fails: the others are stopped and
the result names the failed worker, e.g. ``worker-1 was killed by SIGKILL (status 137)``.

    python -m byteps_prophet.cluster.loopback_torch -n 2 [--timeout S] -- python train.py
"""
from __future__ import annotations

import sys
from typing import Callable, Mapping, Sequence

from byteps_prophet.cluster.local import Cluster, ClusterSpec, launcher_main
from byteps_prophet.cluster.processes import RunResult


def run_workers(argv: Sequence[str], workers: int, env: Mapping[str, str] | None = None,
                timeout: float | None = None,
                output: Callable[[str, str], None] | bool | None = None) -> RunResult:
    """Run ``argv`` in ``workers`` processes; ``output(name, line)`` sees each line (True: print them)."""
    with Cluster(ClusterSpec(workers=workers, netns=False, parameter_server=False), output=output or False) as cluster:
        return cluster.run(list(argv), env=env, timeout=timeout)


def main(argv: list[str] | None = None) -> int:
    return launcher_main(
        "python -m byteps_prophet.cluster.loopback_torch", __doc__.split("\n")[0],
        lambda parser: parser.add_argument("-n", "--workers", type=int, default=2, help="worker processes (default 2)"),
        lambda args, command: run_workers(command, args.workers, timeout=args.timeout, output=True), argv)


if __name__ == "__main__":
    sys.exit(main())
