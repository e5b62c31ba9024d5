"""The scheduled store over byteps.mxnet (BytePS's MXNet plugin) on the local cluster.

Parameters after K Gluon steps must be equal (1e-6) under FIFO, ByteScheduler and Prophet, with
partitions and Prophet's finer atoms exercised. Needs the patched BytePS (scripts/build_byteps.sh).
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mxnet")

WORKER = str(Path(__file__).with_name("worker_train.py"))
ENV = {"BPP_BACKEND": "byteps", "BPP_STEPS": "6", "BYTESCHEDULER_PARTITION": "5000",
       "PROPHET_MXNET_ATOM_ELEMENTS": "1000", "BYTESCHEDULER_CREDIT": "12000"}


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
    with Cluster(ClusterSpec(workers=2, servers=1, bandwidth="1gbit", engine="byteps", grace=2.0),
                 output=False) as cluster:
        for scheduler in ("fifo", "bytescheduler", "prophet"):
            path = out / f"{scheduler}.npz"
            result = cluster.run([sys.executable, WORKER], timeout=240,
                                 env=dict(ENV, BYTEPS_SCHEDULER=scheduler, BPP_OUT=str(path)))
            runs[scheduler] = result
            if result.ok and path.exists():
                values[scheduler] = dict(np.load(path))
    return values, runs


def _check(results, scheduler):
    values, runs = results
    for name in ("fifo", scheduler):
        result = runs[name]
        assert result.ok, (name, result.reason, {k: v[-10:] for k, v in result.output.items()})
    fifo, other = values["fifo"], values[scheduler]
    assert fifo.keys() == other.keys()
    assert any(np.abs(v).sum() > 0 for v in fifo.values())
    for key in fifo:
        np.testing.assert_allclose(other[key], fifo[key], rtol=0, atol=1e-6, err_msg=key)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_bytescheduler_equals_fifo_on_byteps(results):
    _check(results, "bytescheduler")


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.xfail(strict=False, reason="known: in about 1 run of 3 on the 2-core machine a Prophet run on byteps.mxnet "
                                        "ends with different parameters (a race not found yet; docs/MXNET.md)")
def test_prophet_equals_fifo_on_byteps(results):
    _check(results, "prophet")
