"""The BYTEPS_SCHEDULER switch in BytePS's MXNet plugin (patch 91): an unmodified Gluon script using
bps.DistributedTrainer is scheduled by byteps_prophet when BYTEPS_SCHEDULER is bytescheduler or
prophet, is stock BytePS when it is unset, and an invalid value stops it at import (one line, exit 2).
Every worker's parameters are compared with what the stock trainer's math gives, computed in one
process (worker_bps_trainer.py --reference).
Needs the patched BytePS (scripts/build_byteps.sh)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from params_check import assert_every_worker_equals, run_report

pytest.importorskip("mxnet")

WORKER = str(Path(__file__).with_name("worker_bps_trainer.py"))
# Partitions small enough that ByteScheduler and Prophet cut this model's tensors.
ENV = {"BPP_STEPS": "5", "BYTESCHEDULER_PARTITION": "5000", "BYTESCHEDULER_CREDIT": "12000"}
KNOBS = ("BYTEPS_SCHEDULER", "BYTESCHEDULER_PARTITION", "BYTESCHEDULER_CREDIT", "PROPHET_MODE")


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in KNOBS and not k.startswith("DMLC_")}
    env.update(extra)
    return env


def test_exit_after_an_unhandled_exception_closes_the_store_alone(monkeypatch):
    """At exit after an unhandled exception (``sys.last_value`` set) the trainer's store closes alone:
    no flush waiting for the last step's rounds, which the other workers may never complete."""
    from byteps_prophet.mxnet.trainer import ScheduledGradients

    calls = []

    class Store:
        def flush(self, timeout=None):
            calls.append("flush")

        def close(self, alone=False):
            calls.append(("close", alone))

    gradients = object.__new__(ScheduledGradients)
    gradients.store, gradients._closed = Store(), False
    monkeypatch.setattr(sys, "last_value", RuntimeError("the script failed"), raising=False)
    gradients.close()
    gradients.close()
    assert calls == [("close", True)]


def test_compression_with_scheduler_is_one_line_error():
    code = ("from byteps_prophet.mxnet.trainer import ScheduledGradients; "
            "ScheduledGradients({'compressor': 'onebit'})")
    run = subprocess.run([sys.executable, "-c", code], env=_clean_env(BYTEPS_SCHEDULER="prophet"),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "compression_params" in lines[0] and "valid:" in lines[0], lines


def _reference(out: Path, steps: str) -> tuple[dict, dict]:
    """What 2 workers of the stock trainer must end with, computed in one process without BytePS,
    and the initial values they start from."""
    path = out / f"reference-{steps}.npz"
    subprocess.run([sys.executable, WORKER, "--reference", "2"], check=True, timeout=120,
                   env=_clean_env(BPP_STEPS=steps, BPP_OUT=str(path)))
    return dict(np.load(path)), dict(np.load(out / f"reference-{steps}.init.npz"))


@pytest.fixture(scope="module")
def results(run_switch_script, tmp_path_factory):
    out = tmp_path_factory.mktemp("bps-switch")

    def env_for(scheduler):
        return dict(ENV, BPP_OUT=str(out / f"{scheduler}.npz"))

    runs = run_switch_script(WORKER, env_for, KNOBS)
    values = {}
    for scheduler, result in runs.items():
        files = [out / f"{scheduler}.rank{r}.npz" for r in range(2)]
        if result.ok and all(f.exists() for f in files):
            values[scheduler] = [dict(np.load(f)) for f in files]
    return values, runs, _reference(out, ENV["BPP_STEPS"])


def _lines(result) -> list[str]:
    return [line for lines in result.output.values() for line in lines]


def _check(results, scheduler):
    values, runs, (expected, initial) = results
    result = runs[scheduler]
    assert result.ok, f"{scheduler}: {run_report(result)}"
    # Every worker ends with the parameters the stock trainer's math gives (exact here: the same ops).
    assert_every_worker_equals(expected, values[scheduler], initial)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_unset_is_stock_byteps(results):
    _check(results, "unset")
    assert not any("byteps_prophet" in line for line in _lines(results[1]["unset"]))


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("scheduler", ["bytescheduler", "prophet"])
def test_scheduler_schedules_unmodified_script(results, scheduler):
    _check(results, scheduler)
    lines = _lines(results[1][scheduler])
    assert len([line for line in lines if f"scheduled by {scheduler} over BytePS" in line]) == 1, lines[-20:]
    # at exit the leader says what it scheduled: every step, the 6 gradients cut into more atoms. Step 0
    # may count as a few: the store closes a step after 20 ms without a registration, and step 0's
    # registrations compete with BytePS's name initialisation (waiting for it no longer ends a step:
    # 7 for 5 steps here, 11 before).
    summary = [line for line in lines if line.startswith(f"byteps_prophet: {scheduler} scheduled ")]
    assert len(summary) == 1, lines[-20:]
    words = summary[0].split()
    steps, keys, atoms = int(words[3]), int(words[6]), int(words[9])
    assert int(ENV["BPP_STEPS"]) <= steps <= int(ENV["BPP_STEPS"]) + 3 and keys == 6 and atoms > keys, summary
