"""BYTEPS_SCHEDULER read at import by BytePS's plugins (patch 90: byteps.torch, patch 91: byteps.mxnet),
both through byteps_prophet.switch.scheduler_from_env: an invalid value or knob stops the import in one
line with exit 2; unset/fifo is stock BytePS and reads no byteps_prophet knob. What each plugin then
schedules is tested with a real cluster in tests/torch/test_byteps_switch.py and
tests/mxnet/test_mxnet_switch.py. Needs the patched BytePS (scripts/build_byteps.sh)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

KNOBS = ("BYTEPS_SCHEDULER", "BYTESCHEDULER_PARTITION", "BYTESCHEDULER_CREDIT", "PROPHET_MODE")


def _run(code: str, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in KNOBS and not k.startswith("DMLC_")}
    return subprocess.run([sys.executable, "-c", code], env=dict(clean, **env), capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module", params=["byteps.torch", "byteps.mxnet"])
def plugin(request) -> str:
    if importlib.util.find_spec("byteps") is None:
        pytest.skip("byteps is not built (scripts/build_byteps.sh)")
    if _run(f"import {request.param} as b; b._SCHEDULER").returncode != 0:
        pytest.skip(f"{request.param} is not built with our patches (scripts/build_byteps.sh)")
    return request.param


def test_invalid_scheduler_stops_import_in_one_line(plugin):
    run = _run(f"import {plugin}", BYTEPS_SCHEDULER="bogus")
    assert run.returncode == 2, run
    assert run.stderr.strip().splitlines() == [
        "byteps: BYTEPS_SCHEDULER='bogus' is not a scheduler; valid: fifo, bytescheduler, prophet"]


@pytest.mark.parametrize("scheduler, knob", [("prophet", {"PROPHET_MODE": "fast"}),
                                             ("bytescheduler", {"BYTESCHEDULER_CREDIT": "lots"})])
def test_invalid_knob_of_selected_scheduler_stops_import(plugin, scheduler, knob):
    run = _run(f"import {plugin}", BYTEPS_SCHEDULER=scheduler, **knob)
    assert run.returncode == 2, run
    (name, value), = knob.items()
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{name}={value!r}" in lines[0] and "valid:" in lines[0], lines


def test_valid_values_are_read(plugin):
    # one process: the value is read again for each case, as at import; fifo (stock BytePS) does not
    # look at a knob only byteps_prophet reads
    code = (f"import os, {plugin} as b\n"
            "for v in ['', 'fifo', 'FIFO']:\n"
            "    os.environ['BYTEPS_SCHEDULER'] = v\n"
            "    print(b._scheduler_from_env())\n"
            "del os.environ['PROPHET_MODE']\n"
            "for v in [' prophet ', 'bytescheduler']:\n"
            "    os.environ['BYTEPS_SCHEDULER'] = v\n"
            "    print(b._scheduler_from_env())\n")
    run = _run(code, PROPHET_MODE="fast")
    assert run.returncode == 0 and run.stderr == "", run
    assert run.stdout.split() == ["fifo", "fifo", "fifo", "prophet", "bytescheduler"]
