"""The scheduled store over byteps.mxnet (BytePS's MXNet plugin) on the local cluster.

Parameters after K Gluon steps must be equal (1e-6) under FIFO, ByteScheduler and Prophet, with
partitions and Prophet's cuts inside them exercised. Needs the patched BytePS (scripts/build_byteps.sh).
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
# Prophet's atoms are its partitions on this backend (byteps_backend.check_atoms); its cuts still
# split partitions into slices that share an atom.
ENV = {"BPP_BACKEND": "byteps", "BPP_STEPS": "6", "BYTESCHEDULER_PARTITION": "5000",
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
@pytest.mark.xfail(strict=False, reason="known bug: a Prophet run on byteps.mxnet sometimes ends with different "
                                        "parameters, also with atoms = partitions (a race not found; docs/MXNET.md)")
def test_prophet_equals_fifo_on_byteps(results):
    _check(results, "prophet")


def test_finer_atoms_than_a_partition_are_refused_on_byteps_for_prophet():
    from byteps_prophet.core import Settings
    from byteps_prophet.errors import ConfigError
    from byteps_prophet.mxnet.byteps_backend import check_atoms

    prophet = Settings(scheduler="prophet", partition=5000)
    with pytest.raises(ConfigError, match=r"PROPHET_MXNET_ATOM_ELEMENTS=1000 is below BYTESCHEDULER_PARTITION=5000"):
        check_atoms(prophet, {"PROPHET_MXNET_ATOM_ELEMENTS": "1000"})
    check_atoms(prophet, {})  # unset: atoms become partitions
    check_atoms(prophet, {"PROPHET_MXNET_ATOM_ELEMENTS": "5000"})
    check_atoms(Settings(scheduler="bytescheduler", partition=5000), {"PROPHET_MXNET_ATOM_ELEMENTS": "1000"})
