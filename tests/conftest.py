"""Fixtures shared by the test folders."""
from __future__ import annotations

import os
import sys

import pytest

SWITCH_RUNS = ("unset", "bytescheduler", "prophet")


@pytest.fixture(scope="module")
def run_switch_script():
    """``run(worker, env_for, knobs)``: an unmodified BytePS script (``worker``) on one 2-worker,
    1-server BytePS cluster at 1 Gbit/s, once per BYTEPS_SCHEDULER value in ``SWITCH_RUNS`` (``unset``:
    not set at all, so the caller's ``knobs`` are taken out of this process's environment meanwhile);
    ``env_for(scheduler)`` gives each run's environment. Returns ``{scheduler: RunResult}``."""
    pytest.importorskip("byteps", reason="byteps is not built (scripts/build_byteps.sh)")
    from byteps_prophet.cluster import Cluster, ClusterSpec

    def run(worker: str, env_for, knobs) -> dict:
        runs = {}
        saved = {k: os.environ.pop(k) for k in knobs if k in os.environ}
        try:
            with Cluster(ClusterSpec(workers=2, servers=1, bandwidth="1gbit", engine="byteps", grace=2.0),
                         output=False) as cluster:
                for scheduler in SWITCH_RUNS:
                    env = env_for(scheduler)
                    if scheduler != "unset":  # nothing else: the cluster tells workers where worker 0 is
                        env["BYTEPS_SCHEDULER"] = scheduler
                    runs[scheduler] = cluster.run([sys.executable, worker], timeout=240, env=env)
        finally:
            os.environ.update(saved)
        return runs

    return run
