"""The scheduled store over byteps.mxnet (BytePS's MXNet plugin) on the local cluster.

Parameters after K Gluon steps must be equal (1e-6) under FIFO, ByteScheduler and Prophet, on every
worker, with partitions and Prophet's cuts inside them exercised. Needs the patched BytePS (scripts/build_byteps.sh).
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from params_check import assert_every_worker_equals, run_report
from trace_check import assert_plan_engaged

pytest.importorskip("mxnet")

WORKER = str(Path(__file__).with_name("worker_train.py"))
# Prophet's default atoms on BytePS-MXNet are the partitions; its cuts end on them. Eight steps: the
# first three profile, and with three decisions left the plan once never engaged (2 of about 110 runs).
ENV = {"BPP_BACKEND": "byteps", "BPP_STEPS": "8", "BYTESCHEDULER_PARTITION": "5000",
       "BYTESCHEDULER_CREDIT": "12000"}


def _byteps_mxnet_built() -> bool:
    if importlib.util.find_spec("byteps") is None:
        return False
    probe = subprocess.run([sys.executable, "-c", "import byteps.mxnet"], capture_output=True, timeout=120)
    return probe.returncode == 0


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    if not _byteps_mxnet_built():
        pytest.skip("byteps.mxnet is not built (scripts/build_byteps.sh)")
    from byteps_prophet.cluster import Cluster, ClusterSpec

    out = tmp_path_factory.mktemp("bps")
    values, runs = {}, {}
    with Cluster(ClusterSpec(workers=2, servers=1, bandwidth="200mbit", engine="byteps", grace=2.0),
                 output=False) as cluster:
        for scheduler in ("fifo", "bytescheduler", "prophet"):
            path = out / f"{scheduler}.npz"
            result = cluster.run([sys.executable, WORKER], timeout=240,
                                 env=dict(ENV, BYTEPS_SCHEDULER=scheduler, BPP_OUT=str(path),
                                          BYTEPS_PROPHET_TRACE=str(out / f"{scheduler}.trace.json")))
            runs[scheduler] = result
            if result.ok and path.exists():
                values[scheduler] = [dict(np.load(path)), dict(np.load(out / f"{scheduler}.rank1.npz"))]
                values[f"{scheduler}.init"] = dict(np.load(out / f"{scheduler}.init.npz"))
    values["out"] = out
    return values, runs


def _check(results, scheduler):
    values, runs = results
    for name in ("fifo", scheduler):
        result = runs[name]
        assert result.ok, f"{name}: {run_report(result)}"
    # Every worker of the run ends with FIFO's worker-0 parameters. Comparing the workers also
    # catches a broadcast that lands late (it once copied the first round's sum into a parameter).
    assert_every_worker_equals(values["fifo"][0], values[scheduler], values[f"{scheduler}.init"])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fifo_workers_agree_on_byteps(results):
    _check(results, "fifo")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_bytescheduler_equals_fifo_on_byteps(results):
    _check(results, "bytescheduler")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_prophet_equals_fifo_on_byteps(results, perfetto_check):
    _check(results, "prophet")
    # its prediction, not the credit it falls back on, scheduled some steps (the leader's trace)
    trace = perfetto_check(results[0]["out"] / "prophet.trace.json")
    assert trace["metadata"]["backend"] == "byteps" and trace["metadata"]["scheduler"] == "prophet"
    assert_plan_engaged(trace, int(ENV["BPP_STEPS"]), "BytePS-MXNet", pieces="send")
