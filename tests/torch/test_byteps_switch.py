"""The BYTEPS_SCHEDULER switch in BytePS's PyTorch plugin (patch 90): an unmodified script using
bps.DistributedOptimizer is scheduled by byteps_prophet when BYTEPS_SCHEDULER is bytescheduler or
prophet, is stock BytePS when it is unset, and an invalid value stops it at import (one line, exit 2,
through byteps_prophet.switch as patch 91 does for MXNet). Every worker's parameters are compared with
the averaged-gradient SGD computed in one process (worker_bps_torch.py --reference).
Needs the patched BytePS (scripts/build_byteps.sh)."""
from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trace_check import assert_every_row_sent_once, assert_plan_engaged

from byteps_prophet.core.trace import events

WORKER = str(Path(__file__).with_name("worker_bps_torch.py"))
# Partitions small enough that ByteScheduler and Prophet cut this model's tensors into several pieces;
# Prophet's fixed BytePS atoms smaller still and not aligned with them, so slices cover atoms partly.
ENV = {"BPP_STEPS": "10", "BYTESCHEDULER_PARTITION": "5000", "BYTESCHEDULER_CREDIT": "12000",
       "BYTEPS_PROPHET_ATOM_ELEMENTS": "3000"}
KNOBS = ("BYTEPS_SCHEDULER", "BYTESCHEDULER_PARTITION", "BYTESCHEDULER_CREDIT", "BYTEPS_PROPHET_ATOM_ELEMENTS", "PROPHET_MODE",
         "BYTEPS_PROPHET_TRACE", "BYTEPS_PROPHET_PROFILE")


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in KNOBS and not k.startswith("DMLC_")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def results(run_switch_script, tmp_path_factory):
    out = tmp_path_factory.mktemp("bps-torch-switch")

    def env_for(scheduler):  # the trace is written by byteps_prophet's optimizer only: stock BytePS ignores it
        return dict(ENV, BPP_OUT=str(out / f"{scheduler}.pt"), BYTEPS_PROPHET_TRACE=str(out / f"{scheduler}.trace.json"))

    runs = run_switch_script(WORKER, env_for, KNOBS)
    values = {}
    for scheduler, result in runs.items():
        files = [out / f"{scheduler}.rank{r}.pt" for r in range(2)]
        if result.ok and all(f.exists() for f in files):
            values[scheduler] = [torch.load(f) for f in files]
    path = out / "reference.pt"
    subprocess.run([sys.executable, WORKER, "--reference", "2"], check=True, timeout=120,
                   env=_clean_env(BPP_OUT=str(path), BPP_STEPS=ENV["BPP_STEPS"]))
    return values, runs, torch.load(path), out


def _check(results, scheduler):
    values, runs, reference, _ = results
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
def test_scheduler_schedules_unmodified_script(results, scheduler, perfetto_check):
    _check(results, scheduler)
    trace = perfetto_check(results[3] / f"{scheduler}.trace.json")
    meta = trace["metadata"]
    assert meta["scheduler"] == scheduler and meta["backend"] == "byteps"
    ops = [e["args"] for e in events(trace, "op")]
    steps = int(ENV["BPP_STEPS"])
    assert {op["iteration"] for op in ops} == set(range(steps)), sorted({op["iteration"] for op in ops})
    per_tensor = collections.Counter((op["iteration"], op["index"]) for op in ops)  # (iteration, tensor) -> ops
    assert len(per_tensor) == steps * len(meta["tensors"]), per_tensor
    assert max(per_tensor.values()) > 1, per_tensor  # the scheduler cut tensors into several atoms
    # rank 1 wrote its own trace next to rank 0's: the same ops (rank 0's order), its own times
    follower = perfetto_check(results[3] / f"{scheduler}.trace.rank1.json")
    follower_ops = list(events(follower, "op"))

    def key(op):
        return op["iteration"], op["index"], *op["rows"]

    assert sorted(key(e["args"]) for e in follower_ops) == sorted(key(op) for op in ops)
    assert all(e["args"]["issue_ts"] == e["ts"] and e["args"]["submit_ts"] is None for e in follower_ops)
    assert sum(1 for _ in events(follower, "ready")) == steps * len(meta["tensors"])
    # exactly once by sums: push_pull(average=True) sent twice gives the same average, so the values
    # above cannot show a duplicate; the rows each rank sent must tile every gradient once per step
    assert_every_row_sent_once(trace, steps, "leader")
    assert_every_row_sent_once(follower, steps, "follower")
    if scheduler == "prophet":  # its prediction, not the credit it falls back on, scheduled some steps
        plans = assert_plan_engaged(trace, steps, "torch/BytePS")
        print("planned iterations:", plans)
