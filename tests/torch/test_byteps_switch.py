"""The BYTEPS_SCHEDULER switch in BytePS's PyTorch plugin (patch 90): an unmodified script using
bps.DistributedOptimizer is scheduled by byteps_prophet when BYTEPS_SCHEDULER is bytescheduler or
prophet, is stock BytePS when it is unset, and an invalid value stops it at import (one line, exit 2,
through byteps_prophet.switch as patch 91 does for MXNet). Every worker's parameters are compared with
the averaged-gradient SGD computed in one process (worker_bps_torch.py --reference).
Needs the patched BytePS (scripts/build_byteps.sh)."""
from __future__ import annotations

import collections
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = str(Path(__file__).with_name("worker_bps_torch.py"))
# Partitions small enough that ByteScheduler and Prophet cut this model's tensors into several atoms.
ENV = {"BPP_STEPS": "4", "BYTESCHEDULER_PARTITION": "5000", "BYTESCHEDULER_CREDIT": "12000"}
# Stock BytePS (unset) runs one step: over several steps its two workers end with different parameters
# here (0.016 apart after 4 steps; byteps_prophet's runs equal the reference to 1e-8), as with the MXNet
# plugin (tests/mxnet/test_mxnet_switch.py, docs/MXNET.md).
STOCK_STEPS = "1"
KNOBS = ("BYTEPS_SCHEDULER", "BYTESCHEDULER_PARTITION", "BYTESCHEDULER_CREDIT", "PROPHET_MODE",
         "BYTEPS_PROPHET_TRACE", "BYTEPS_PROPHET_PROFILE")


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in KNOBS and not k.startswith("DMLC_")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def built():
    if importlib.util.find_spec("byteps") is None:
        pytest.skip("byteps is not built (scripts/build_byteps.sh)")
    probe = subprocess.run([sys.executable, "-c", "import byteps.torch as b; b._SCHEDULER"],
                           env=_clean_env(), capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        pytest.skip("byteps.torch is not built with patch 90 (scripts/build_byteps.sh)")


def _import(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import byteps.torch"], env=_clean_env(**env),
                          capture_output=True, text=True, timeout=120)


def test_invalid_scheduler_stops_import_in_one_line(built):
    run = _import({"BYTEPS_SCHEDULER": "bogus"})
    assert run.returncode == 2, run
    assert run.stderr.strip().splitlines() == [
        "byteps: BYTEPS_SCHEDULER='bogus' is not a scheduler; valid: fifo, bytescheduler, prophet"]


def test_invalid_knob_of_selected_scheduler_stops_import(built):
    run = _import({"BYTEPS_SCHEDULER": "bytescheduler", "BYTESCHEDULER_CREDIT": "lots"})
    assert run.returncode == 2, run
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "BYTESCHEDULER_CREDIT='lots'" in lines[0] and "valid:" in lines[0], lines


def test_valid_values_are_read(built):
    # one process: the value is read again for each case, as at import; fifo (stock BytePS) does not
    # look at a knob only byteps_prophet reads
    code = ("import os, byteps.torch as b\n"
            "os.environ['PROPHET_MODE'] = 'fast'\n"
            "for v in ['', 'fifo', 'FIFO']:\n"
            "    os.environ['BYTEPS_SCHEDULER'] = v\n"
            "    print(b._scheduler_from_env())\n"
            "del os.environ['PROPHET_MODE']\n"
            "for v in [' prophet ', 'bytescheduler']:\n"
            "    os.environ['BYTEPS_SCHEDULER'] = v\n"
            "    print(b._scheduler_from_env())\n")
    run = subprocess.run([sys.executable, "-c", code], env=_clean_env(PROPHET_MODE="fast"), capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0 and run.stderr == "", run
    assert run.stdout.split() == ["fifo", "fifo", "fifo", "prophet", "bytescheduler"]


@pytest.fixture(scope="module")
def results(built, tmp_path_factory):
    from byteps_prophet.cluster import Cluster, ClusterSpec

    out = tmp_path_factory.mktemp("bps-torch-switch")
    values, runs = {}, {}
    saved = {k: os.environ.pop(k) for k in KNOBS if k in os.environ}  # "unset" must be unset
    try:
        with Cluster(ClusterSpec(workers=2, servers=1, bandwidth="1gbit", engine="byteps", grace=2.0),
                     output=False) as cluster:
            for scheduler in ("unset", "bytescheduler", "prophet"):
                # the trace is written by byteps_prophet's optimizer only: stock BytePS ignores it
                env = dict(ENV, BPP_OUT=str(out / f"{scheduler}.pt"),
                           BYTEPS_PROPHET_TRACE=str(out / f"{scheduler}.trace.json"))
                if scheduler == "unset":
                    env["BPP_STEPS"] = STOCK_STEPS
                else:  # nothing else: the cluster tells the workers where worker 0's order channel is
                    env["BYTEPS_SCHEDULER"] = scheduler
                result = cluster.run([sys.executable, WORKER], timeout=240, env=env)
                runs[scheduler] = result
                files = [out / f"{scheduler}.rank{r}.pt" for r in range(2)]
                if result.ok and all(f.exists() for f in files):
                    values[scheduler] = [torch.load(f) for f in files]
    finally:
        os.environ.update(saved)
    references = {}
    for steps in {STOCK_STEPS, ENV["BPP_STEPS"]}:
        path = out / f"reference-{steps}.pt"
        subprocess.run([sys.executable, WORKER, "--reference", "2"], check=True, timeout=120,
                       env=_clean_env(BPP_STEPS=steps, BPP_OUT=str(path)))
        references[steps] = torch.load(path)
    return values, runs, references, out


def _check(results, scheduler):
    values, runs, references, _ = results
    reference = references[STOCK_STEPS if scheduler == "unset" else ENV["BPP_STEPS"]]
    result = runs[scheduler]
    assert result.ok, f"{scheduler}: {result.reason}\n" + "\n".join(
        f"--- {role}\n" + "\n".join(lines[-15:]) for role, lines in result.output.items())
    assert any(v.abs().sum() > 0 for v in reference.values())
    for rank, params in enumerate(values[scheduler]):
        assert params.keys() == reference.keys()
        for key in reference:
            torch.testing.assert_close(params[key], reference[key], rtol=0, atol=1e-6,
                                       msg=lambda m: f"{scheduler} {key} rank {rank}: {m}")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_unset_is_stock_byteps(results):
    _check(results, "unset")
    assert not (results[3] / "unset.trace.json").exists()  # byteps_prophet's optimizer never ran


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("scheduler", ["bytescheduler", "prophet"])
def test_scheduler_schedules_unmodified_script(results, scheduler):
    _check(results, scheduler)
    trace = json.loads((results[3] / f"{scheduler}.trace.json").read_text())
    assert trace["meta"]["scheduler"] == scheduler and trace["meta"]["backend"] == "byteps"
    ops = [e for e in trace["events"] if e[0] == "op"]
    steps = int(ENV["BPP_STEPS"])
    assert {e[1] for e in ops} == set(range(steps)), sorted({e[1] for e in ops})
    per_tensor = collections.Counter((e[1], e[2]) for e in ops)  # (iteration, tensor) -> ops
    assert len(per_tensor) == steps * len(trace["meta"]["tensors"]), per_tensor
    assert max(per_tensor.values()) > 1, per_tensor  # the scheduler cut tensors into several atoms
