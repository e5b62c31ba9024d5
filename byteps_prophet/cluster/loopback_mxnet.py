"""Run an MXNet ps-lite job on 127.0.0.1 (scheduler, servers, workers as local processes).

For tests and quick runs without namespaces or shaping (``byteps-prophet cluster run --engine mxnet``
is the shaped, multi-host version). A thin wrapper over that same local cluster on plain loopback:
``run_local`` picks a free port, starts every role with the cluster's DMLC_* environment, ends the
whole job as soon as any role exits non-zero (naming it), at the timeout, or when every worker has
exited 0, and leaves no process behind. The caller's ``BYTEPS_*`` variables reach every role.

``python -m byteps_prophet.cluster.loopback_mxnet -w 2 -s 1 [--timeout S] -- COMMAND...``
"""
from __future__ import annotations

import os
import sys

from byteps_prophet.cluster.local import Cluster, ClusterSpec, launcher_main
from byteps_prophet.cluster.processes import RunResult
from byteps_prophet.cluster.roles import TOPOLOGY_KEYS


def run_local(command: list[str], workers: int = 2, servers: int = 1, env: dict | None = None,
              timeout: float = 300.0, grace: float = 10.0, echo: bool = False) -> RunResult:
    """``grace``: how long the scheduler and servers may linger after every worker exited 0."""
    run_env = {k: v for k, v in os.environ.items() if k.startswith("BYTEPS_") and k not in TOPOLOGY_KEYS}
    run_env.update(env or {})
    spec = ClusterSpec(workers=workers, servers=servers, engine="mxnet", netns=False, grace=grace)
    with Cluster(spec, output=echo) as cluster:
        return cluster.run(list(command), env=run_env, timeout=timeout)


def _options(parser) -> None:
    parser.add_argument("-w", "--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("-s", "--servers", type=int, default=1, help="server processes (default 1)")


def main(argv: list[str] | None = None) -> int:
    return launcher_main("python -m byteps_prophet.cluster.loopback_mxnet", __doc__.split("\n")[0], _options,
                         lambda args, command: run_local(command, args.workers, args.servers,
                                                         timeout=args.timeout, echo=True), argv, timeout=600.0)


if __name__ == "__main__":
    sys.exit(main())
